"""HCS shared kernel: messages, subjects, bus and Kubernetes adapters, profiles,
settings and telemetry. Never imports a part (agents, scheduler, injector,
healer) nor the CLI."""
