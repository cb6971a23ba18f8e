/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Writes the JSON line contract (see README.md) to a FILE. */
#ifndef HCS_EMIT_H
#define HCS_EMIT_H

#include <stdio.h>
#include <stddef.h>
#include "classify.h"

/* Writes s as a JSON string (quotes included); invalid UTF-8 -> U+FFFD. */
void hcs_json_string(FILE *f, const char *s, size_t len);

/* Writes a string or null. */
void hcs_json_opt_string(FILE *f, const char *s);

/* Opens one event object up to and including '"evidence":{'. */
void hcs_emit_begin(FILE *f, const char *source, const struct hcs_class *c,
		    const char *msg, size_t msg_len, unsigned long long ts_ns);

/* Evidence members; the first one written must pass first=true. */
void hcs_emit_evidence_str(FILE *f, bool first, const char *key, const char *val);
void hcs_emit_evidence_num(FILE *f, bool first, const char *key, long long val);

/* Closes the evidence and the object, writes '\n' and flushes. */
void hcs_emit_end(FILE *f);

#endif
