/* Configuration (read once), logging, constructor and destructor. */
#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hcs.h"

struct hcs_state hcs_g;
__thread int hcs_rt_depth __attribute__((tls_model("initial-exec")));

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

void hcs_log_impl(int level, const char *fmt, ...) {
    static const char *names[] = {"off", "error", "warn", "info", "debug"};
    char buf[512];
    int n = snprintf(buf, sizeof buf, "[hcs-interceptor %d] %s: ", (int)getpid(), names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf) n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf - 1) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}

static int parse_log_level(const char *s) {
    if (!s || !*s) return HCS_LOG_OFF;
    if (!strcasecmp(s, "error")) return HCS_LOG_ERROR;
    if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning")) return HCS_LOG_WARN;
    if (!strcasecmp(s, "info")) return HCS_LOG_INFO;
    if (!strcasecmp(s, "debug")) return HCS_LOG_DEBUG;
    return HCS_LOG_OFF;
}

/* "16Gi", "1.5Gi", "512Mi", "1000000", "2G". 0 on success. */
static int parse_size(const char *s, const char *end, uint64_t *out) {
    const char *p = s;
    uint64_t ip = 0, frac = 0, fscale = 1;
    int digits = 0;
    while (p < end && isspace((unsigned char)*p)) p++;
    while (p < end && isdigit((unsigned char)*p)) {
        if (ip > (UINT64_MAX - 9) / 10) return -1;
        ip = ip * 10 + (uint64_t)(*p - '0');
        p++;
        digits++;
    }
    if (p < end && *p == '.') {
        p++;
        while (p < end && isdigit((unsigned char)*p)) {
            if (fscale < 1000000000000ULL) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                fscale *= 10;
            }
            p++;
            digits++;
        }
    }
    if (!digits) return -1;
    uint64_t mult = 1;
    size_t rest = (size_t)(end - p);
    while (rest && isspace((unsigned char)p[rest - 1])) rest--;
    if (rest) {
        static const char *bin = "KMGTP";
        const char *u = strchr(bin, toupper((unsigned char)p[0]));
        if (p[0] == 'k') u = bin;
        if (!u || !*u) return -1;
        int e = (int)(u - bin) + 1;
        size_t used = 1;
        int binary = rest >= 2 && p[1] == 'i';
        if (binary) used = 2;
        if (rest > used && p[used] == 'B') used++;
        if (rest != used) return -1;
        for (int i = 0; i < e; i++) mult *= binary ? 1024 : 1000;
    }
    if (ip && mult > UINT64_MAX / ip) return -1;
    uint64_t v = ip * mult;
    uint64_t fv = (uint64_t)((unsigned __int128)frac * mult / fscale);
    if (v > UINT64_MAX - fv) return -1;
    *out = v + fv;
    return 0;
}

/* HCS_VRAM_QUOTA: "16Gi" (all devices) or "0:16Gi,1:8Gi" (unlisted devices
 * are unlimited). Returns 0 on success; on error out[] is untouched. */
int hcs_parse_quota(const char *s, uint64_t out[HCS_MAX_DEVICES]) {
    uint64_t q[HCS_MAX_DEVICES];
    for (int i = 0; i < HCS_MAX_DEVICES; i++) q[i] = HCS_UNLIMITED;
    if (!strchr(s, ':')) {
        uint64_t v;
        if (parse_size(s, s + strlen(s), &v)) return -1;
        for (int i = 0; i < HCS_MAX_DEVICES; i++) q[i] = v;
    } else {
        const char *p = s;
        while (*p) {
            const char *comma = strchr(p, ',');
            const char *end = comma ? comma : p + strlen(p);
            const char *colon = memchr(p, ':', (size_t)(end - p));
            if (!colon) return -1;
            char *e;
            long dev = strtol(p, &e, 10);
            while (e < colon && isspace((unsigned char)*e)) e++;
            if (e != colon || dev < 0 || dev >= HCS_MAX_DEVICES) return -1;
            uint64_t v;
            if (parse_size(colon + 1, end, &v)) return -1;
            q[dev] = v;
            p = comma ? comma + 1 : end;
        }
    }
    memcpy(out, q, sizeof q);
    return 0;
}

/* CUDA_VISIBLE_DEVICES="2,0" -> NVML index 2 is ordinal 0, index 0 is 1.
 * Non-numeric lists (UUIDs, MIG) keep the identity mapping. */
static void build_nvml_map(void) {
    for (int i = 0; i < 64; i++) hcs_g.nvml_map[i] = i;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v || !*v) return;
    int map[64];
    for (int i = 0; i < 64; i++) map[i] = -1;
    int ord = 0;
    const char *p = v;
    while (*p) {
        char *e;
        long idx = strtol(p, &e, 10);
        if (e == p || idx < 0 || idx >= 64) return;
        if (map[idx] < 0) map[idx] = ord;
        ord++;
        while (*e == ' ') e++;
        if (*e == ',') e++;
        else if (*e) return;
        p = e;
    }
    memcpy(hcs_g.nvml_map, map, sizeof map);
}

static void do_init(void) {
    hcs_g.log_level = parse_log_level(getenv("HCS_INTERCEPTOR_LOG"));
    hcs_g.fd = -1;
    const char *path = getenv("HCS_SHM_PATH");
    if (!path || !*path) path = HCS_DEFAULT_SHM_PATH;
    const char *q = getenv("HCS_VRAM_QUOTA");
    if (!q || !*q) {
        /* A child whose variable was unset still lives in the pod whose
         * accounting file records the quota. */
        if (hcs_shm_recorded_quota(path, hcs_g.quota) != 0) {
            HCS_LOG(HCS_LOG_INFO, "HCS_VRAM_QUOTA not set: pass-through");
            atomic_store_explicit(&hcs_g.mode, HCS_MODE_PASS, memory_order_release);
            return;
        }
        HCS_LOG(HCS_LOG_WARN, "HCS_VRAM_QUOTA not set: enforcing the quota recorded in %s", path);
    } else if (hcs_parse_quota(q, hcs_g.quota)) {
        /* Fail closed: a broken quota must not hand out the whole device. */
        HCS_LOG(HCS_LOG_ERROR, "invalid HCS_VRAM_QUOTA '%s': denying all device allocations", q);
        for (int i = 0; i < HCS_MAX_DEVICES; i++) hcs_g.quota[i] = 0;
    }
    build_nvml_map();
    if (hcs_ptrtab_init() || hcs_shm_open(path)) {
        HCS_LOG(HCS_LOG_ERROR, "cannot set up accounting: pass-through");
        atomic_store_explicit(&hcs_g.mode, HCS_MODE_PASS, memory_order_release);
        return;
    }
    hcs_reap();
    pthread_atfork(NULL, NULL, hcs_after_fork_child);
    if (hcs_g.log_level >= HCS_LOG_INFO) {
        int uniform = 1;
        for (int i = 1; i < HCS_MAX_DEVICES; i++) uniform &= hcs_g.quota[i] == hcs_g.quota[0];
        for (int i = 0; i < (uniform ? 1 : HCS_MAX_DEVICES); i++)
            if (uniform)
                hcs_log_impl(HCS_LOG_INFO, "every device: quota %llu bytes (%s)", (unsigned long long)hcs_g.quota[0],
                             hcs_g.shared ? path : "private");
            else if (hcs_g.quota[i] != HCS_UNLIMITED)
                hcs_log_impl(HCS_LOG_INFO, "device %d quota %llu bytes (%s)", i,
                             (unsigned long long)hcs_g.quota[i], hcs_g.shared ? path : "private");
    }
    atomic_store_explicit(&hcs_g.mode, HCS_MODE_ENFORCE, memory_order_release);
}

void hcs_init(void) { pthread_once(&init_once, do_init); }

__attribute__((constructor)) static void hcs_ctor(void) { hcs_init(); }

__attribute__((destructor)) static void hcs_dtor(void) {
    if (atomic_load_explicit(&hcs_g.mode, memory_order_acquire) != HCS_MODE_ENFORCE) return;
    /* Later frees (other destructors) pass through instead of double-refunding. */
    atomic_store_explicit(&hcs_g.mode, HCS_MODE_PASS, memory_order_release);
    hcs_release_own_slot();
}
