/* Real-symbol resolution and the dlsym hook. */
#include <dlfcn.h>
#include <string.h>

#include "hcs.h"

const struct hcs_sym_info hcs_syms[HK_COUNT] = {
#define HOOK(lib, name) [HK_##name] = {#name, (void *)name, lib},
#define HELPER(lib, name) [HK_##name] = {#name, NULL, lib},
#include "hooks.def"
#undef HOOK
#undef HELPER
};

void *hcs_real_ptr[HK_COUNT];

static const char *const lib_names[HCS_LIB_COUNT][5] = {
    [HCS_LIB_CUDA] = {"libcuda.so.1", "libcuda.so", NULL},
    [HCS_LIB_CUDART] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", NULL},
    [HCS_LIB_NVML] = {"libnvidia-ml.so.1", "libnvidia-ml.so", NULL},
    [HCS_LIB_ACL] = {"libascendcl.so", NULL},
    [HCS_LIB_HIP] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5", NULL},
    [HCS_LIB_CNRT] = {"libcnrt.so", NULL},
};

/* Handle of the vendor library as the application opened it. */
static void *lib_handle[HCS_LIB_COUNT];

typedef void *(*dlsym_fn)(void *, const char *);

/* Sanitizer runtimes call dlsym while they initialise, before instrumented
 * code may run: the entry path of the hook stays uninstrumented. */
#define HCS_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
static dlsym_fn real_dlsym_fn;
static void *hcs_dlsym_hook(void *handle, const char *name);
static __thread int in_bootstrap __attribute__((tls_model("initial-exec")));

HCS_NO_SANITIZE static dlsym_fn get_real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
    if (HCS_LIKELY(f != NULL)) return f;
    if (in_bootstrap) return NULL; /* dlvsym re-entered us */
    in_bootstrap = 1;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    /* the definition after us (libc.so.6 from glibc 2.34, libdl.so.2
     * before); failing that (e.g. we were dlopen'ed locally) ask libc by
     * handle. No dlopen first: sanitizer runtimes intercept it and call
     * dlsym before their own interceptors are ready. */
    for (int i = 0; !f && versions[i]; i++) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    static const char *const libs[] = {"libc.so.6", "libdl.so.2", NULL};
    for (int l = 0; !f && libs[l]; l++) {
        void *h = dlopen(libs[l], RTLD_LAZY | RTLD_NOLOAD);
        for (int i = 0; h && !f && versions[i]; i++) f = (dlsym_fn)dlvsym(h, "dlsym", versions[i]);
    }
    if (f == hcs_dlsym_hook) f = NULL; /* found ourselves */
    in_bootstrap = 0;
    if (f) __atomic_store_n(&real_dlsym_fn, f, __ATOMIC_RELEASE);
    return f;
}

void *hcs_dlsym_real(void *handle, const char *name) {
    dlsym_fn f = get_real_dlsym();
    return f ? f(handle, name) : NULL;
}

static int is_own(int idx, void *p) { return p == NULL || p == hcs_syms[idx].wrapper; }

void hcs_learn_real(int idx, void *pfn) {
    if (is_own(idx, pfn)) return;
    void *expect = NULL;
    __atomic_compare_exchange_n(&hcs_real_ptr[idx], &expect, pfn, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

void *hcs_resolve_slow(int idx) {
    const struct hcs_sym_info *s = &hcs_syms[idx];
    void *p = NULL;
    void *h = __atomic_load_n(&lib_handle[s->lib], __ATOMIC_ACQUIRE);
    if (h) p = hcs_dlsym_real(h, s->name);
    if (is_own(idx, p)) p = hcs_dlsym_real(RTLD_NEXT, s->name);
    for (int pass = 0; pass < 2 && is_own(idx, p); pass++) {
        /* pass 0: already loaded; pass 1: the application called a wrapper,
         * so it wants the library: load it. */
        for (int i = 0; lib_names[s->lib][i] && is_own(idx, p); i++) {
            void *lh = dlopen(lib_names[s->lib][i], RTLD_LAZY | (pass == 0 ? RTLD_NOLOAD : 0));
            if (lh) p = hcs_dlsym_real(lh, s->name);
        }
        if (!s->wrapper) break; /* helpers never load a library */
    }
    if (is_own(idx, p)) {
        HCS_LOG(HCS_LOG_DEBUG, "real %s not found", s->name);
        return NULL;
    }
    hcs_learn_real(idx, p);
    return __atomic_load_n(&hcs_real_ptr[idx], __ATOMIC_ACQUIRE);
}

/* Quick filter on name prefixes of hooked symbols. */
HCS_NO_SANITIZE static inline int maybe_hooked(const char *n) {
    switch (n[0]) {
    case 'c': return n[1] == 'u' || (n[1] == 'n' && n[2] == 'r');
    case 'n': return n[1] == 'v' && n[2] == 'm';
    case 'a': return n[1] == 'c' && n[2] == 'l';
    case 'h': return n[1] == 'i' && n[2] == 'p';
    default: return 0;
    }
}

static int find_hook(const char *name) {
    for (int i = 0; i < HK_COUNT; i++)
        if (hcs_syms[i].wrapper && !strcmp(hcs_syms[i].name, name)) return i;
    return -1;
}

static void *dlsym_hooked(int idx, void *handle, const char *name) {
    dlsym_fn f = get_real_dlsym();
    if (!f) return NULL;
    void *p = f(handle, name);
    if (p == hcs_syms[idx].wrapper) {
        /* Found our own export (RTLD_DEFAULT): answer as if we were absent. */
        p = __atomic_load_n(&hcs_real_ptr[idx], __ATOMIC_ACQUIRE);
        if (!p) p = f(RTLD_NEXT, name);
        if (p == hcs_syms[idx].wrapper) p = NULL;
    }
    if (!p) return NULL;
    if (hcs_mode() != HCS_MODE_ENFORCE) return p;
    {
        hcs_learn_real(idx, p);
        if (handle != RTLD_DEFAULT && handle != RTLD_NEXT) {
            void *expect = NULL;
            __atomic_compare_exchange_n(&lib_handle[hcs_syms[idx].lib], &expect, handle, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE);
        }
    }
    return hcs_syms[idx].wrapper;
}

HCS_NO_SANITIZE static void *hcs_dlsym_hook(void *handle, const char *name) {
    const char *n = name;
    __asm__("" : "+r"(n)); /* dlfcn.h declares name nonnull; callers may still pass NULL */
    if (n && maybe_hooked(n)) {
        int idx = find_hook(name);
        if (idx >= 0) return dlsym_hooked(idx, handle, name);
    }
    dlsym_fn f = get_real_dlsym();
    if (HCS_UNLIKELY(!f)) return NULL;
    /* Tail call, so that the real dlsym sees the application's return
     * address (matters for RTLD_NEXT). */
    return f(handle, name);
}

HCS_EXPORT void *dlsym(void *restrict handle, const char *restrict name) __attribute__((alias("hcs_dlsym_hook")));
