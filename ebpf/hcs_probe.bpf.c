// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* HCS kernel probes: PCIe AER tracepoint, driver fault log lines, test probe.
 * Every event goes through one BPF ring buffer; user space classifies. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "hcs_probe.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

const volatile bool filter_prefixes = true;
const volatile __u32 test_tgid = 0;

/* Layout of ras:aer_event; relocated by CO-RE against the running kernel's
 * trace_event_raw_aer_event (absent on kernels without PCIe AER: then this
 * program is simply not loaded). */
struct trace_event_raw_aer_event___hcs {
	struct trace_entry ent;
	__u32 __data_loc_dev_name;
	__u32 status;
	__u8 severity;
	__u8 tlp_header_valid;
	__u32 tlp_header[4];
} __attribute__((preserve_access_index));

#define HEAD_LEN 16

static __always_inline bool has_prefix(const char *s, const char *p, int n)
{
#pragma unroll
	for (int i = 0; i < HEAD_LEN; i++) {
		if (i >= n)
			return true;
		if (s[i] != p[i])
			return false;
	}
	return true;
}

#define PFX(lit) has_prefix(head, lit, sizeof(lit) - 1)

/* First bytes of the kernel lines worth shipping to user space:
 * NVIDIA NVRM/nvswitch, AER (pcieport/pci/device drivers), amdgpu-style
 * (Hygon DCU), Ascend, Cambricon, and the loader's own self-test line. */
static __always_inline bool interesting(const char *head)
{
	return PFX("NVRM") || PFX("nvidia") || PFX("pcieport") || PFX("pci ") ||
	       PFX("amdgpu") || PFX("hydcu") || PFX("hycu") || PFX("[drm") ||
	       PFX("[ascend]") || PFX("devdrv") || PFX("davinci") ||
	       PFX("ERROR: [Card") || PFX("WARNING: [Card") || PFX("cambricon") ||
	       PFX("hcs-probe:");
}

static __always_inline void fill_common(struct hcs_event *e, __u32 type)
{
	e->type = type;
	e->tgid = bpf_get_current_pid_tgid() >> 32;
	e->ts_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(e->comm, sizeof(e->comm));
}

SEC("tracepoint/printk/console")
int handle_console(struct trace_event_raw_console *ctx)
{
	char head[HEAD_LEN] = {};
	__u32 loc = ctx->__data_loc_msg;
	const char *msg = (const char *)ctx + (loc & 0xFFFF);
	struct hcs_event *e;
	long n;

	bpf_probe_read_kernel_str(head, sizeof(head), msg);
	if (filter_prefixes && !interesting(head))
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	__builtin_memset(e, 0, sizeof(*e) - HCS_MSG_LEN);
	fill_common(e, HCS_EV_LOG);
	n = bpf_probe_read_kernel_str(e->msg, sizeof(e->msg), msg);
	e->msg_len = n > 0 ? n - 1 : 0;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tracepoint/ras/aer_event")
int handle_aer(struct trace_event_raw_aer_event___hcs *ctx)
{
	struct hcs_event *e;
	__u32 loc;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	__builtin_memset(e, 0, sizeof(*e));
	fill_common(e, HCS_EV_AER);
	loc = BPF_CORE_READ(ctx, __data_loc_dev_name);
	bpf_probe_read_kernel_str(e->dev, sizeof(e->dev), (const char *)ctx + (loc & 0xFFFF));
	e->aer_status = BPF_CORE_READ(ctx, status);
	e->aer_severity = BPF_CORE_READ(ctx, severity);
	if (bpf_core_field_exists(ctx->tlp_header_valid)) {
		e->tlp_valid = BPF_CORE_READ(ctx, tlp_header_valid);
		bpf_core_read(&e->tlp, sizeof(e->tlp), &ctx->tlp_header);
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* Test-only: proves load + attach + ring buffer on this kernel. Loaded only
 * when the loader is given --test-pid. */
SEC("tracepoint/syscalls/sys_enter_getppid")
int handle_getppid(void *ctx)
{
	struct hcs_event *e;

	if (!test_tgid || (bpf_get_current_pid_tgid() >> 32) != test_tgid)
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	__builtin_memset(e, 0, sizeof(*e));
	fill_common(e, HCS_EV_TEST);
	bpf_ringbuf_submit(e, 0);
	return 0;
}
