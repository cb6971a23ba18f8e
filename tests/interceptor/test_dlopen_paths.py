"""Applications that dlopen the vendor library and look symbols up (ctypes),
and the cuGetProcAddress paths the CUDA runtime uses."""

from __future__ import annotations

from .conftest import Env, GiB, MiB

PRELUDE = """
import ctypes
c_size = ctypes.c_size_t
def info(fn, *lead):
    free, total = c_size(), c_size()
    rc = fn(*lead, ctypes.byref(free), ctypes.byref(total))
    return rc, free.value, total.value
"""


def test_ctypes_dlopen_of_libcuda_gets_the_wrappers(vram: Env) -> None:
    code = (
        PRELUDE
        + """
cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), c_size]
cu.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
p, q = ctypes.c_ulonglong(), ctypes.c_ulonglong()
print("alloc rc=%d" % cu.cuMemAlloc_v2(ctypes.byref(p), 768 << 20))
print("alloc rc=%d" % cu.cuMemAlloc_v2(ctypes.byref(q), 768 << 20))
print("info rc=%d free=%d total=%d" % info(cu.cuMemGetInfo_v2))
print("free rc=%d" % cu.cuMemFree_v2(p))
print("info rc=%d free=%d total=%d" % info(cu.cuMemGetInfo_v2))
"""
    )
    r = vram.python(code)
    assert [x["rc"] for x in r.ops("alloc")] == ["0", "2"]
    assert (int(r.ops("info")[0]["free"]), int(r.ops("info")[0]["total"])) == (256 * MiB, GiB)
    assert r.ops("free")[0]["rc"] == "0"
    assert int(r.ops("info")[1]["free"]) == GiB


def test_ctypes_nvml_sees_the_slice(vram: Env) -> None:
    code = (
        PRELUDE
        + """
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
nv = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlInit_v2()
h = ctypes.c_void_p()
nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
m = Mem()
rc = nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
print("nvml rc=%d total=%d free=%d used=%d" % (rc, m.total, m.free, m.used))
"""
    )
    r = vram.python(code, HCS_VRAM_QUOTA="3Gi")
    assert r.op(0) == {
        "op": "nvml",
        "rc": "0",
        "total": str(3 * GiB),
        "free": str(3 * GiB),
        "used": "0",
    }


def test_ctypes_dlopen_of_acl_hip_and_cnrt_gets_the_wrappers(vram: Env) -> None:
    code = (
        PRELUDE
        + """
for lib, alloc, args, free, meminfo, lead in [
    ("libascendcl.so", "aclrtMalloc", (0,), "aclrtFree", "aclrtGetMemInfo", (1,)),
    ("libamdhip64.so", "hipMalloc", (), "hipFree", "hipMemGetInfo", ()),
    ("libcnrt.so", "cnrtMalloc", (), "cnrtFree", "cnrtMemGetInfo", ()),
]:
    l = ctypes.CDLL(lib)
    getattr(l, alloc).argtypes = [ctypes.POINTER(ctypes.c_void_p), c_size] + [ctypes.c_int] * len(args)
    p, q = ctypes.c_void_p(), ctypes.c_void_p()
    rc1 = getattr(l, alloc)(ctypes.byref(p), 900 << 20, *args)
    rc2 = getattr(l, alloc)(ctypes.byref(q), 200 << 20, *args)
    rc, f, t = info(getattr(l, meminfo), *lead)
    getattr(l, free).argtypes = [ctypes.c_void_p]
    rcf = getattr(l, free)(p)
    print("%s rc=%d second=%d free=%d total=%d freed=%d" % (lib, rc1, rc2, f, t, rcf))
"""
    )
    r = vram.python(code)
    seconds = {line["op"]: int(line["second"]) for line in r.lines}
    assert seconds == {"libascendcl.so": 207001, "libamdhip64.so": 2, "libcnrt.so": 100100}
    for line in r.lines:
        assert line["rc"] == "0" and line["freed"] == "0"
        assert (int(line["free"]), int(line["total"])) == (GiB - 900 * MiB, GiB)


def test_cu_get_proc_address_entry_points_are_wrapped(vram: Env) -> None:
    for api in ("v1", "v2"):
        for flags in ("0", "2"):  # default and per-thread default stream
            r = vram.cli(
                "gpa",
                api,
                12000,
                flags,
                "g.alloc",
                "700Mi",
                "g.alloc",
                "700Mi",
                "g.async",
                "300Mi",
                "g.async",
                "300Mi",
                "g.info",
                "freeall",
                "g.info",
            )
            assert r.op(0)["wrapped"] == "1", (api, flags)
            assert r.rcs()[1:5] == [0, 2, 0, 2], (api, flags)
            assert int(r.ops("g.info")[0]["free"]) == GiB - 1000 * MiB
            assert int(r.ops("g.info")[1]["free"]) == GiB


def test_cu_get_proc_address_suffix_fallback_wraps_internal_entry_points(vram: Env) -> None:
    # the stub driver hands out internal trampolines that are not the
    # exported cuMemAlloc_v2 etc.: the wrapper is chosen by name + "_v2"
    r = vram.cli(
        "gpa",
        "v2",
        12000,
        0,
        "g.alloc",
        "700Mi",
        "g.alloc",
        "700Mi",
        "g.info",
        "freeall",
        "g.info",
        STUB_GPA_INDIRECT="1",
        HCS_INTERCEPTOR_LOG="debug",
    )
    assert r.rcs()[1:3] == [0, 2]
    assert int(r.ops("g.info")[0]["free"]) == GiB - 700 * MiB
    assert int(r.ops("g.info")[1]["free"]) == GiB
    assert "wrapped as cuMemAlloc_v2 by suffix" in r.stderr


def test_dlsym_of_cu_get_proc_address_returns_the_wrapper(vram: Env) -> None:
    code = """
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
gpa = cu.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]
pfn = ctypes.c_void_p()
rc = gpa(b"cuMemAlloc", ctypes.byref(pfn), 12000, 0, None)
alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t)(pfn.value)
p = ctypes.c_ulonglong()
print("gpa rc=%d" % rc)
print("alloc rc=%d" % alloc(ctypes.byref(p), 2 << 30))
print("alloc rc=%d" % alloc(ctypes.byref(p), 1 << 20))
"""
    r = vram.python(code)
    assert r.rcs() == [0, 2, 0]
