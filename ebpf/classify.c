// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "classify.h"
#include "xid_severity.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static bool starts(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

static bool has(const char *s, const char *needle)
{
	return strstr(s, needle) != NULL;
}

static bool has_ci(const char *s, const char *needle)
{
	return strcasestr(s, needle) != NULL;
}

static bool in_table(const int *table, size_t n, long code)
{
	for (size_t i = 0; i < n; i++)
		if (table[i] == code)
			return true;
	return false;
}

const char *hcs_xid_severity(long code)
{
	if (in_table(xid_fatal, ARRAY_LEN(xid_fatal), code))
		return "fatal";
	if (in_table(xid_info, ARRAY_LEN(xid_info), code))
		return "info";
	return "warning";
}

static bool hex_run(const char *s, int n)
{
	for (int i = 0; i < n; i++)
		if (!isxdigit((unsigned char)s[i]))
			return false;
	return true;
}

static bool bdf_at(const char *s)
{
	return hex_run(s, 4) && s[4] == ':' && hex_run(s + 5, 2) && s[7] == ':' &&
	       hex_run(s + 8, 2) && !isxdigit((unsigned char)s[10]);
}

const char *hcs_find_bdf(const char *s, char out[HCS_BDF_LEN])
{
	for (const char *p = s; *p; p++) {
		if ((p > s && isxdigit((unsigned char)p[-1])) || !bdf_at(p))
			continue;
		char fn = (p[10] == '.' && p[11] >= '0' && p[11] <= '7') ? p[11] : '0';
		snprintf(out, HCS_BDF_LEN, "%.10s.%c", p, fn);
		for (char *c = out; *c; c++)
			*c = (char)tolower((unsigned char)*c);
		return p;
	}
	out[0] = '\0';
	return NULL;
}

static bool int_after(const char *s, const char *marker, long *out)
{
	const char *p = strstr(s, marker);
	char *end;

	if (!p)
		return false;
	p += strlen(marker);
	if (!isdigit((unsigned char)*p))
		return false;
	*out = strtol(p, &end, 10);
	return end != p;
}

const char *hcs_vendor_of_driver(const char *line)
{
	if (starts(line, "nvidia") || starts(line, "NVRM"))
		return "nvidia";
	if (starts(line, "amdgpu ") || starts(line, "hydcu ") || starts(line, "hycu "))
		return "hygon";
	if (starts(line, "devdrv") || starts(line, "[ascend]") || starts(line, "davinci"))
		return "huawei";
	if (starts(line, "cambricon"))
		return "cambricon";
	return NULL;
}

const char *hcs_vendor_of_pci_id(unsigned int id)
{
	switch (id) {
	case 0x10de: return "nvidia";
	case 0x19e5: return "huawei";
	case 0x1d94: return "hygon";
	case 0xcabc: return "cambricon";
	default: return NULL;
	}
}

static void init_class(struct hcs_class *c, const char *kind, const char *vendor)
{
	memset(c, 0, sizeof(*c));
	c->kind = kind;
	c->vendor = vendor;
	c->severity = "warning";
	c->device_index = -1;
}

static void device_index_after(const char *line, const char *marker, struct hcs_class *c)
{
	long v;

	if (int_after(line, marker, &v))
		c->device_index = (int)v;
}

/* Severity from keywords, for vendors without a numeric code catalogue. */
static const char *escalate(const char *line, const char *dflt)
{
	static const char *const fatal[] = {"heartbeat lost", "heart beat lost",
		"lost heartbeat", "heartbeat timeout", "fallen off"};
	static const char *const critical[] = {"timeout", "timed out", "ecc",
		"hbm", "reset", "hang", "uncorrect"};

	for (size_t i = 0; i < ARRAY_LEN(fatal); i++)
		if (has_ci(line, fatal[i]))
			return "fatal";
	if (has_ci(line, "fatal") && !has_ci(line, "non-fatal"))
		return "fatal";
	for (size_t i = 0; i < ARRAY_LEN(critical); i++)
		if (has_ci(line, critical[i]))
			return "critical";
	return dflt;
}

static bool classify_sxid(const char *line, struct hcs_class *c)
{
	const char *p = strstr(line, "SXid (");

	if (!p)
		return false;
	init_class(c, "sxid", "nvidia");
	hcs_find_bdf(p, c->bus);
	c->has_code = int_after(p, "): ", &c->code);
	if (has(p, ", Fatal"))
		c->severity = "fatal";
	if (starts(line, "nvidia-nvswitch"))
		device_index_after(line, "nvidia-nvswitch", c);
	return true;
}

static bool classify_xid(const char *line, struct hcs_class *c)
{
	const char *p = strstr(line, "NVRM: Xid (");

	if (!p)
		return false;
	init_class(c, "xid", "nvidia");
	hcs_find_bdf(p, c->bus);
	c->has_code = int_after(p, "): ", &c->code);
	if (c->has_code)
		c->severity = hcs_xid_severity(c->code);
	if ((c->has_code && c->code == 79) || has(line, "fallen off the bus")) {
		c->kind = "fallen_off_bus";
		c->severity = "fatal";
	}
	return true;
}

static bool classify_fallen(const char *line, struct hcs_class *c)
{
	if (!has(line, "fallen off the bus") || !(has(line, "NVRM") || starts(line, "nvidia")))
		return false;
	init_class(c, "fallen_off_bus", "nvidia");
	c->severity = "fatal";
	hcs_find_bdf(line, c->bus);
	return true;
}

static const char *aer_kind(const char *s, const char **severity)
{
	if (starts(s, "Uncorrected (Fatal)")) {
		*severity = "fatal";
		return "aer_fatal";
	}
	if (starts(s, "Uncorrected (Non-Fatal)")) {
		*severity = "critical";
		return "aer_nonfatal";
	}
	if (starts(s, "Corrected")) {
		*severity = "info";
		return "aer_correctable";
	}
	return NULL;
}

static bool classify_aer_bus_error(const char *line, struct hcs_class *c)
{
	const char *p = strstr(line, "PCIe Bus Error: severity=");
	const char *severity = NULL, *kind;

	if (!p || !(kind = aer_kind(p + strlen("PCIe Bus Error: severity="), &severity)))
		return false;
	init_class(c, kind, hcs_vendor_of_driver(line));
	c->severity = severity;
	hcs_find_bdf(line, c->bus);
	return true;
}

static bool classify_aer_received(const char *line, struct hcs_class *c)
{
	const char *p = strstr(line, "AER: "), *r, *kind, *severity = NULL;

	if (!p || !(r = strstr(p, " error received: ")))
		return false;
	p += strlen("AER: ");
	if (starts(p, "Multiple "))
		p += strlen("Multiple ");
	if (!(kind = aer_kind(p, &severity)))
		return false;
	init_class(c, kind, NULL);
	c->severity = severity;
	hcs_find_bdf(line, c->port);
	hcs_find_bdf(r, c->bus);
	return true;
}

static bool amd_gate(const char *line)
{
	return starts(line, "amdgpu ") || starts(line, "hydcu ") || starts(line, "hycu ") ||
	       starts(line, "[drm:amdgpu") || starts(line, "[drm:hydcu") ||
	       starts(line, "[drm:hycu");
}

static bool ring_timeout(const char *line)
{
	for (const char *p = strstr(line, "ring "); p; p = strstr(p + 1, "ring ")) {
		const char *q = p + 5;

		if (p > line && isalnum((unsigned char)p[-1]))
			continue;
		if (*q == '\0' || isspace((unsigned char)*q))
			continue;
		while (*q && !isspace((unsigned char)*q))
			q++;
		if (starts(q, " timeout"))
			return true;
	}
	return false;
}

static const char *amd_severity(const char *line, struct hcs_class *c)
{
	if (has(line, "reset failed") || has(line, "recovery failed") || has(line, "VRAM is lost"))
		return "fatal";
	if (has(line, "GPU fault detected")) {
		c->has_code = int_after(line, "GPU fault detected: ", &c->code);
		return "warning";
	}
	if (has(line, "page fault (src_id"))
		return "warning";
	if (ring_timeout(line) || has(line, "GPU reset begin") || has(line, "MODE1 reset") ||
	    has(line, "MODE2 reset") || has(line, "device wedged"))
		return "critical";
	if (has(line, "reset succeeded"))
		return "warning";
	return NULL;
}

static bool classify_hygon(const char *line, struct hcs_class *c)
{
	const char *severity;

	if (!amd_gate(line))
		return false;
	init_class(c, "hygon_fault", "hygon");
	severity = amd_severity(line, c);
	if (!severity)
		return false;
	c->severity = severity;
	hcs_find_bdf(line, c->bus);
	return true;
}

static bool classify_ascend(const char *line, struct hcs_class *c)
{
	static const char *const words[] = {"heartbeat", "heart beat", "fatal",
		"timeout", "ecc", "hbm", "fault"};
	bool hit = has(line, "[ERROR]");

	if (!starts(line, "[ascend]") && !starts(line, "devdrv") && !starts(line, "davinci"))
		return false;
	for (size_t i = 0; !hit && i < ARRAY_LEN(words); i++)
		hit = has_ci(line, words[i]);
	if (!hit)
		return false;
	init_class(c, "ascend_fault", "huawei");
	c->severity = escalate(line, "warning");
	hcs_find_bdf(line, c->bus);
	device_index_after(line, "devid=", c);
	if (c->device_index < 0)
		device_index_after(line, "dev_id=", c);
	return true;
}

static bool classify_cambricon(const char *line, struct hcs_class *c)
{
	bool tagged = starts(line, "ERROR: [Card") || starts(line, "WARNING: [Card");
	bool driver = starts(line, "cambricon") &&
		      (has_ci(line, "error") || has_ci(line, "fail") || has_ci(line, "timeout") ||
		       has_ci(line, "heartbeat"));

	if (!tagged && !driver)
		return false;
	if (tagged && !isdigit((unsigned char)strstr(line, "[Card")[5]))
		return false;
	init_class(c, "cambricon_fault", "cambricon");
	c->severity = escalate(line, "warning");
	hcs_find_bdf(line, c->bus);
	device_index_after(line, "[Card", c);
	return true;
}

static bool classify_selftest(const char *line, struct hcs_class *c)
{
	if (!starts(line, "hcs-probe: selftest"))
		return false;
	init_class(c, "test_probe", NULL);
	c->severity = "info";
	return true;
}

bool hcs_classify(const char *line, struct hcs_class *out)
{
	return classify_selftest(line, out) || classify_sxid(line, out) ||
	       classify_xid(line, out) || classify_fallen(line, out) ||
	       classify_aer_bus_error(line, out) || classify_aer_received(line, out) ||
	       classify_hygon(line, out) || classify_ascend(line, out) ||
	       classify_cambricon(line, out);
}
