#!/bin/sh
# Run the interceptor scenarios under a sanitizer build (make asan / make tsan).
# usage: run_sanitized.sh asan|tsan BUILD_DIR
set -eu
kind=$1
B=$(cd "$2" && pwd)
rt=$(${CC:-gcc} -print-file-name="lib$kind.so")
shm=$(mktemp /tmp/hcs_san_XXXXXX)
: > "$shm"
trap 'rm -f "$shm"' EXIT
export LD_LIBRARY_PATH="$B/stubs"
export LD_PRELOAD="$rt $B/libhcs_interceptor.so"
export HCS_SHM_PATH="$shm" HCS_VRAM_QUOTA=1Gi STUB_TOTAL_BYTES=4Gi
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:exitcode=66
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:exitcode=66
# ThreadSanitizer (gcc 12) cannot map its shadow with high-entropy ASLR.
wrap=""
if [ "$kind" = tsan ] && command -v setarch >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
    wrap="setarch $(uname -m) -R"
fi
cli() {
    echo "+ hcs_cli $*"
    out=$($wrap "$B/tests/hcs_cli" "$@") || { echo "$out"; echo "FAILED ($kind): hcs_cli $*"; exit 1; }
    echo "$out" | sed 's/^/    /'
    if echo "$out" | grep -q '^contend' && ! echo "$out" | grep -q 'other=0 free_fail=0'; then
        echo "FAILED ($kind): contention errors"; exit 1
    fi
}
if [ "$kind" = asan ]; then
    cli cu.alloc 512Mi cu.alloc 600Mi cu.info nvml.info 0 nvml.info2 0 freeall cu.info
    cli cu.pitch 1000 1000 cu.managed 1Mi cu.async 1Mi cu.async_ptsz 1Mi cu.pool 1Mi cu.pool_ptsz 1Mi freeall
    cli cu.vmm 256Mi 0 cu.vmm 1Gi 1 cu.array 1024 1024 cu.array3d 64 64 64 cu.mipmap 256 256 0 5 freeall
    cli gpa v1 12000 0 g.alloc 1Mi g.info freeall gpa v2 12000 2 g.async 1Mi freeall
    STUB_GPA_INDIRECT=1 cli gpa v2 12000 0 g.alloc 2Gi g.alloc 1Mi freeall
    cli rt.alloc 700Mi rt.alloc 700Mi rt.info rt.async 1Mi rt.managed 1Mi freeall
    cli acl.alloc 1Mi acl.info 1 hip.alloc 1Mi hip.info cnrt.alloc 2Gi cnrt.info freeall
    cli cu.vmm 768Mi 0 cu.map cu.release cu.vmm 768Mi 0 free cu.vmm 512Mi 1 cu.map freeall
    cli cu.pool_threshold 1Gi cu.async 600Mi free cu.alloc 600Mi cu.trim 0 cu.async 100Mi freeall
    cli cu.graph 700Mi cu.instantiate flags cu.instantiate params cu.instantiate gpa freeall
    cli cu.v1.alloc 600Mi cu.v1.pitch 1000 1000 cu.v1.array 64 64 cu.v1.info gpa1 3000 g1.alloc 1Mi g1.info freeall
    cli hip.managed 1Mi hip.ext 1Mi hip.async 1Mi hip.poolasync 1Mi hip.pitch 100 100 hip.mempitch 100 100 hip.array 64 64 hip.vmm 1Mi hip.threshold 1Gi hip.trim 0 freeall
    cli acl.cached 1Mi acl.align32 1Mi acl.cfg 1Mi acl.vmm 1Mi cnrt.constant 1Mi cnrt.async 1Mi cnrt.threshold 1Gi cnrt.trim 0 freeall
    cli cu.free_raw 0xdeadbeef cu.alloc 0 cu.alloc 0xffffffffffffffff cu.info
    cli contend 4 300 100Mi stats 0
    # the escape suite's programs (their verdicts are checked by pytest)
    for e in "$B"/escapes/*; do
        echo "+ $(basename "$e")"
        opts=$ASAN_OPTIONS
        # LeakSanitizer cannot stop the world from inside a new pid namespace
        [ "$(basename "$e")" = pid_namespaces ] && opts="$opts:detect_leaks=0"
        out=$(ASAN_OPTIONS=$opts "$e") || { echo "$out"; echo "FAILED ($kind): $(basename "$e")"; exit 1; }
        echo "$out" | tail -1 | sed 's/^/    /'
    done
else
    cli contend 8 1500 300Mi stats 0
    cli contend 8 1500 150Mi stats 0 cu.info
    cli gpa v2 12000 0 contend 4 500 300Mi
fi
echo "$kind: all scenarios passed"
