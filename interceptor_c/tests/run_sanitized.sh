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
    cli cu.free_raw 0xdeadbeef cu.alloc 0 cu.alloc 0xffffffffffffffff cu.info
    cli contend 4 300 100Mi stats 0
else
    cli contend 8 1500 300Mi stats 0
    cli contend 8 1500 150Mi stats 0 cu.info
    cli gpa v2 12000 0 contend 4 500 300Mi
fi
echo "$kind: all scenarios passed"
