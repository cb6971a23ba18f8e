// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
#include <string.h>
#include "emit.h"

/* Length of the valid UTF-8 sequence at s (0 if invalid). */
static size_t utf8_len(const unsigned char *s, size_t left)
{
	size_t n;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4;
	else
		return 0;
	if (n > left)
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	return n;
}

static void json_char(FILE *f, unsigned char ch)
{
	switch (ch) {
	case '"': fputs("\\\"", f); break;
	case '\\': fputs("\\\\", f); break;
	case '\n': fputs("\\n", f); break;
	case '\r': fputs("\\r", f); break;
	case '\t': fputs("\\t", f); break;
	default:
		if (ch < 0x20 || ch == 0x7f)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
}

void hcs_json_string(FILE *f, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;

	fputc('"', f);
	while (i < len && p[i]) {
		size_t n = utf8_len(p + i, len - i);

		if (n == 0) {
			fputs("\\ufffd", f);
			i++;
		} else if (n == 1) {
			json_char(f, p[i++]);
		} else {
			fwrite(p + i, 1, n, f);
			i += n;
		}
	}
	fputc('"', f);
}

void hcs_json_opt_string(FILE *f, const char *s)
{
	if (s && *s)
		hcs_json_string(f, s, strlen(s));
	else
		fputs("null", f);
}

void hcs_emit_begin(FILE *f, const char *source, const struct hcs_class *c,
		    const char *msg, size_t msg_len, unsigned long long ts_ns)
{
	fprintf(f, "{\"v\":1,\"source\":\"%s\",\"kind\":\"%s\",\"vendor\":", source, c->kind);
	hcs_json_opt_string(f, c->vendor);
	fputs(",\"pci_bus_id\":", f);
	hcs_json_opt_string(f, c->bus);
	if (c->device_index >= 0)
		fprintf(f, ",\"device_index\":%d", c->device_index);
	else
		fputs(",\"device_index\":null", f);
	if (c->has_code)
		fprintf(f, ",\"code\":%ld", c->code);
	else
		fputs(",\"code\":null", f);
	fprintf(f, ",\"severity\":\"%s\",\"message\":", c->severity);
	hcs_json_string(f, msg, msg_len);
	fprintf(f, ",\"ts_ns\":%llu,\"evidence\":{", ts_ns);
}

void hcs_emit_evidence_str(FILE *f, bool first, const char *key, const char *val)
{
	fprintf(f, "%s\"%s\":", first ? "" : ",", key);
	hcs_json_string(f, val, strlen(val));
}

void hcs_emit_evidence_num(FILE *f, bool first, const char *key, long long val)
{
	fprintf(f, "%s\"%s\":%lld", first ? "" : ",", key, val);
}

void hcs_emit_end(FILE *f)
{
	fputs("}}\n", f);
	fflush(f);
}
