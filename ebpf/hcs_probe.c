// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* hcs-probe: loads the HCS BPF programs it can, reports on stderr (one JSON
 * status object per line) which tracepoints are missing, and prints one JSON
 * line per event on stdout (contract: ebpf/README.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <bpf/libbpf.h>
#include "hcs_probe.h"
#include "classify.h"
#include "emit.h"
#include "hcs_probe.skel.h"

#define BPF_FS_MAGIC_NR 0xcafe4a11
#define MAX_PROBES 3

struct options {
	unsigned int test_pid;
	bool all_lines;
	bool no_aer;
	bool classify_stdin;
	long max_events;
};

struct probe {
	const char *category;
	const char *name;
	struct bpf_program *prog;
	bool wanted;
	bool present;
	struct bpf_link *link;
	int error;
};

struct state {
	struct probe probes[MAX_PROBES];
	bool aer_attached;
	long events;
	long max_events;
};

static volatile sig_atomic_t exiting;

static void on_signal(int sig)
{
	(void)sig;
	exiting = 1;
}

static const char *const tracefs_roots[] = {"/sys/kernel/tracing", "/sys/kernel/debug/tracing"};

static void status_error(const char *stage, const char *what, int err)
{
	fprintf(stderr, "{\"status\":\"error\",\"stage\":\"%s\",\"error\":", stage);
	hcs_json_string(stderr, what, strlen(what));
	fprintf(stderr, ",\"errno\":%d,\"strerror\":", err);
	hcs_json_opt_string(stderr, strerror(err));
	fputs("}\n", stderr);
	fflush(stderr);
}

static void ensure_mounts(void)
{
	struct statfs st;

	if (access("/sys/kernel/tracing/events", F_OK) != 0 &&
	    access("/sys/kernel/debug/tracing/events", F_OK) != 0 &&
	    mount("tracefs", "/sys/kernel/tracing", "tracefs", 0, NULL) != 0)
		status_error("mount", "tracefs /sys/kernel/tracing", errno);
	if ((statfs("/sys/fs/bpf", &st) != 0 || st.f_type != BPF_FS_MAGIC_NR) &&
	    mount("bpf", "/sys/fs/bpf", "bpf", 0, NULL) != 0)
		status_error("mount", "bpf /sys/fs/bpf", errno);
}

/* 1: present, 0: missing, -1: unknown (no tracefs to look at). */
static int tracepoint_present(const char *category, const char *name)
{
	char path[256];

	for (size_t i = 0; i < sizeof(tracefs_roots) / sizeof(tracefs_roots[0]); i++) {
		snprintf(path, sizeof(path), "%s/events", tracefs_roots[i]);
		if (access(path, F_OK) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/events/%s/%s", tracefs_roots[i], category, name);
		return access(path, F_OK) == 0;
	}
	return -1;
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{"test-pid", required_argument, NULL, 't'},
		{"all-lines", no_argument, NULL, 'a'},
		{"no-aer", no_argument, NULL, 'n'},
		{"max-events", required_argument, NULL, 'm'},
		{"classify", no_argument, NULL, 'c'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int opt;

	memset(o, 0, sizeof(*o));
	while ((opt = getopt_long(argc, argv, "t:anm:ch", longopts, NULL)) != -1) {
		switch (opt) {
		case 't': o->test_pid = (unsigned int)strtoul(optarg, NULL, 10); break;
		case 'a': o->all_lines = true; break;
		case 'n': o->no_aer = true; break;
		case 'm': o->max_events = strtol(optarg, NULL, 10); break;
		case 'c': o->classify_stdin = true; break;
		default:
			fprintf(stderr, "usage: %s [--test-pid PID] [--all-lines] [--no-aer] "
					"[--max-events N] [--classify]\n", argv[0]);
			return opt == 'h' ? 1 : -1;
		}
	}
	return 0;
}

static void emit_log_line(struct state *s, const struct hcs_event *e)
{
	struct hcs_class c;
	size_t len = e->msg_len < HCS_MSG_LEN ? e->msg_len : HCS_MSG_LEN - 1;
	char line[HCS_MSG_LEN];

	memcpy(line, e->msg, len);
	line[len] = '\0';
	while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
		line[--len] = '\0';
	if (!hcs_classify(line, &c))
		return;
	if (s->aer_attached && strncmp(c.kind, "aer_", 4) == 0)
		return; /* the ras:aer_event probe reports these already */
	hcs_emit_begin(stdout, "ebpf", &c, line, len, e->ts_ns);
	hcs_emit_evidence_str(stdout, true, "probe", "printk:console");
	if (c.has_code && c.vendor && strcmp(c.kind, "sxid") != 0 && strcmp(c.vendor, "nvidia") == 0)
		hcs_emit_evidence_num(stdout, false, "xid", c.code);
	if (c.port[0])
		hcs_emit_evidence_str(stdout, false, "reporting_port", c.port);
	hcs_emit_end(stdout);
	s->events++;
}

static const char *vendor_from_sysfs(const char *dev)
{
	char path[128];
	unsigned int id = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", dev);
	f = fopen(path, "r");
	if (!f)
		return NULL;
	if (fscanf(f, "%x", &id) != 1)
		id = 0;
	fclose(f);
	return hcs_vendor_of_pci_id(id);
}

static void aer_class(const struct hcs_event *e, struct hcs_class *c)
{
	memset(c, 0, sizeof(*c));
	c->device_index = -1;
	c->has_code = true;
	c->code = e->aer_status;
	if (e->aer_severity == HCS_AER_CORRECTABLE) {
		c->kind = "aer_correctable";
		c->severity = "info";
	} else if (e->aer_severity == HCS_AER_FATAL) {
		c->kind = "aer_fatal";
		c->severity = "fatal";
	} else {
		c->kind = "aer_nonfatal";
		c->severity = "critical";
	}
	if (!hcs_find_bdf(e->dev, c->bus))
		snprintf(c->bus, sizeof(c->bus), "%.15s", e->dev);
	c->vendor = vendor_from_sysfs(c->bus);
}

static void emit_aer(struct state *s, const struct hcs_event *e)
{
	struct hcs_class c;
	char msg[160], buf[64];

	aer_class(e, &c);
	snprintf(msg, sizeof(msg), "AER %s error status 0x%08x on %.31s", c.kind + 4,
		 e->aer_status, e->dev);
	hcs_emit_begin(stdout, "ebpf", &c, msg, strlen(msg), e->ts_ns);
	hcs_emit_evidence_str(stdout, true, "probe", "ras:aer_event");
	snprintf(buf, sizeof(buf), "0x%08x", e->aer_status);
	hcs_emit_evidence_str(stdout, false, "status", buf);
	if (e->tlp_valid) {
		snprintf(buf, sizeof(buf), "%08x %08x %08x %08x", e->tlp[0], e->tlp[1],
			 e->tlp[2], e->tlp[3]);
		hcs_emit_evidence_str(stdout, false, "tlp_header", buf);
	}
	hcs_emit_end(stdout);
	s->events++;
}

static void emit_test(struct state *s, const struct hcs_event *e)
{
	struct hcs_class c = {.kind = "test_probe", .severity = "info", .device_index = -1};
	char msg[96], comm[HCS_COMM_LEN + 1] = {0};

	memcpy(comm, e->comm, HCS_COMM_LEN);
	snprintf(msg, sizeof(msg), "getppid() by pid %u (%s)", e->tgid, comm);
	hcs_emit_begin(stdout, "ebpf", &c, msg, strlen(msg), e->ts_ns);
	hcs_emit_evidence_str(stdout, true, "probe", "syscalls:sys_enter_getppid");
	hcs_emit_evidence_num(stdout, false, "pid", e->tgid);
	hcs_emit_evidence_str(stdout, false, "comm", comm);
	hcs_emit_end(stdout);
	s->events++;
}

static int handle_event(void *ctx, void *data, size_t size)
{
	struct state *s = ctx;
	const struct hcs_event *e = data;

	if (size < sizeof(*e))
		return 0;
	if (e->type == HCS_EV_LOG)
		emit_log_line(s, e);
	else if (e->type == HCS_EV_AER)
		emit_aer(s, e);
	else if (e->type == HCS_EV_TEST)
		emit_test(s, e);
	if (ferror(stdout) || (s->max_events > 0 && s->events >= s->max_events))
		exiting = 1;
	return 0;
}

static void json_names(FILE *f, const struct state *s, int which)
{
	bool first = true;

	fputc('[', f);
	for (int i = 0; i < MAX_PROBES; i++) {
		const struct probe *p = &s->probes[i];
		bool pick = (which == 0 && p->link) || (which == 1 && p->wanted && !p->present) ||
			    (which == 2 && p->wanted && p->present && !p->link);

		if (!pick)
			continue;
		fprintf(f, "%s\"%s:%s\"", first ? "" : ",", p->category, p->name);
		first = false;
	}
	fputc(']', f);
}

static void status_ready(const struct state *s)
{
	fputs("{\"status\":\"ready\",\"attached\":", stderr);
	json_names(stderr, s, 0);
	fputs(",\"missing\":", stderr);
	json_names(stderr, s, 1);
	fputs(",\"failed\":", stderr);
	json_names(stderr, s, 2);
	fputs("}\n", stderr);
	fflush(stderr);
}

static void plan_probes(struct state *s, struct hcs_probe_bpf *skel, const struct options *o)
{
	struct probe init[MAX_PROBES] = {
		{.category = "printk", .name = "console", .prog = skel->progs.handle_console,
		 .wanted = true},
		{.category = "ras", .name = "aer_event", .prog = skel->progs.handle_aer,
		 .wanted = !o->no_aer},
		{.category = "syscalls", .name = "sys_enter_getppid",
		 .prog = skel->progs.handle_getppid, .wanted = o->test_pid != 0},
	};

	memcpy(s->probes, init, sizeof(init));
	for (int i = 0; i < MAX_PROBES; i++) {
		struct probe *p = &s->probes[i];

		p->present = p->wanted && tracepoint_present(p->category, p->name) != 0;
		bpf_program__set_autoload(p->prog, p->present);
	}
}

static int attach_probes(struct state *s)
{
	int attached = 0;

	for (int i = 0; i < MAX_PROBES; i++) {
		struct probe *p = &s->probes[i];

		if (!p->present)
			continue;
		p->link = bpf_program__attach(p->prog);
		if (!p->link) {
			p->error = errno;
			status_error("attach", bpf_program__name(p->prog), p->error);
			continue;
		}
		attached++;
	}
	s->aer_attached = s->probes[1].link != NULL;
	return attached;
}

static int classify_stdin(void)
{
	char line[4096];

	while (fgets(line, sizeof(line), stdin)) {
		struct hcs_class c;
		size_t len = strcspn(line, "\r\n");

		line[len] = '\0';
		if (!hcs_classify(line, &c)) {
			puts("null");
			continue;
		}
		hcs_emit_begin(stdout, "kmsg", &c, line, len, 0);
		if (c.port[0])
			hcs_emit_evidence_str(stdout, true, "reporting_port", c.port);
		hcs_emit_end(stdout);
	}
	fflush(stdout);
	return 0;
}

static int libbpf_quiet(enum libbpf_print_level level, const char *fmt, va_list args)
{
	if (level == LIBBPF_DEBUG)
		return 0;
	return vfprintf(stderr, fmt, args);
}

static int run(const struct options *o)
{
	struct state s = {.max_events = o->max_events};
	struct hcs_probe_bpf *skel = hcs_probe_bpf__open();
	struct ring_buffer *rb = NULL;
	int err = 0;

	if (!skel) {
		status_error("open", "hcs_probe_bpf__open", errno);
		return 2;
	}
	skel->rodata->filter_prefixes = !o->all_lines;
	skel->rodata->test_tgid = o->test_pid;
	plan_probes(&s, skel, o);
	if ((err = hcs_probe_bpf__load(skel)) != 0) {
		status_error("load", "hcs_probe_bpf__load", -err);
		err = 2;
		goto out;
	}
	if (attach_probes(&s) == 0) {
		status_ready(&s);
		status_error("attach", "no probe attached", ENOENT);
		err = 3;
		goto out;
	}
	rb = ring_buffer__new(bpf_map__fd(skel->maps.events), handle_event, &s, NULL);
	if (!rb) {
		status_error("ringbuf", "ring_buffer__new", errno);
		err = 2;
		goto out;
	}
	status_ready(&s);
	while (!exiting) {
		int n = ring_buffer__poll(rb, 200);

		if (n < 0 && n != -EINTR) {
			status_error("poll", "ring_buffer__poll", -n);
			err = 4;
			break;
		}
	}
out:
	ring_buffer__free(rb);
	for (int i = 0; i < MAX_PROBES; i++)
		bpf_link__destroy(s.probes[i].link);
	hcs_probe_bpf__destroy(skel);
	return err;
}

int main(int argc, char **argv)
{
	struct options o;
	int rc = parse_options(argc, argv, &o);

	if (rc != 0)
		return rc < 0 ? 64 : 0;
	if (o.classify_stdin)
		return classify_stdin();
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGPIPE, SIG_IGN);
	libbpf_set_print(libbpf_quiet);
	ensure_mounts();
	return run(&o);
}
