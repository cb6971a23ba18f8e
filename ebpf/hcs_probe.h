/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Record shared by the BPF programs and the hcs-probe loader (ring buffer). */
#ifndef HCS_PROBE_H
#define HCS_PROBE_H

#define HCS_MSG_LEN 512
#define HCS_DEV_LEN 32
#define HCS_COMM_LEN 16

enum hcs_ev_type {
	HCS_EV_LOG = 1,  /* printk:console line (driver fault candidates) */
	HCS_EV_AER = 2,  /* ras:aer_event */
	HCS_EV_TEST = 3, /* syscalls:sys_enter_getppid from the test pid */
};

/* include/linux/aer.h */
enum hcs_aer_severity {
	HCS_AER_NONFATAL = 0,
	HCS_AER_FATAL = 1,
	HCS_AER_CORRECTABLE = 2,
};

struct hcs_event {
	__u32 type;
	__u32 tgid;
	__u64 ts_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 aer_status;
	__u8 aer_severity;
	__u8 tlp_valid;
	__u16 msg_len;
	__u32 tlp[4];
	char comm[HCS_COMM_LEN];
	char dev[HCS_DEV_LEN];
	char msg[HCS_MSG_LEN];
};

#endif
