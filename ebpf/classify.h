/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Kernel log line -> probe event classification. Mirrors
 * agents/probes/kernel_lines.py; tests/probes checks the two agree. */
#ifndef HCS_CLASSIFY_H
#define HCS_CLASSIFY_H

#include <stdbool.h>

#define HCS_BDF_LEN 16

struct hcs_class {
	const char *kind;     /* xid, sxid, fallen_off_bus, aer_*, ..._fault, test_probe */
	const char *vendor;   /* NULL -> JSON null */
	const char *severity; /* info, warning, critical, fatal */
	char bus[HCS_BDF_LEN]; /* "" -> JSON null; normalised dddd:bb:dd.f */
	char port[HCS_BDF_LEN]; /* AER "error received" lines: the reporting port */
	bool has_code;
	long code;
	int device_index;     /* -1 -> JSON null */
};

/* Returns true and fills *out when the line is a known fault line. */
bool hcs_classify(const char *line, struct hcs_class *out);

/* Severity estimate of an Xid code (table from xid_severity.json). */
const char *hcs_xid_severity(long code);

/* Finds the first PCI address (dddd:bb:dd[.f]) in s; normalised into out. */
const char *hcs_find_bdf(const char *s, char out[HCS_BDF_LEN]);

/* Vendor implied by the driver name that prefixes a dev_printk line. */
const char *hcs_vendor_of_driver(const char *line);

/* Vendor of a PCI vendor id (0x10de ...), NULL if not an accelerator vendor. */
const char *hcs_vendor_of_pci_id(unsigned int id);

#endif
