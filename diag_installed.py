import os, subprocess, sys, time, tempfile, sysconfig
from pathlib import Path
sys.path.insert(0, "tests")
from harness.bundle import make_bundle
from harness.rootfs import RootfsCache, copy_rootfs
work = Path(tempfile.mkdtemp(prefix="diag-"))
config = work / "config.yaml"; config.write_text(f"root: /\nlog: {{file: {work / 'hook.log'}}}\n")
hook_path = str(Path(sysconfig.get_path("scripts")) / "nvc-py-hook")
sock = work / "installed" / "hook.sock"
hook = {"path": hook_path, "args": ["nvc-py-hook", "prestart"], "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}", f"NVC_PY_HOOK_SOCKET={sock}", f"NVC_PY_HOST_PID={os.getpid()}"]}
base = RootfsCache(work / "cache").get("debian")
(work / "b").mkdir()
rootfs = copy_rootfs(base, work / "b" / "rootfs")
bundle = make_bundle(work / "b", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks={"prestart": [hook]})
crun = subprocess.Popen(["crun", "--root", str(work / "state"), "run", "--bundle", str(bundle), "diag1"], stdout=open(work / "out", "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
t0 = time.monotonic()
try:
    crun.wait(timeout=15)
    print("crun ended", crun.returncode, round(time.monotonic() - t0, 2), "s")
except subprocess.TimeoutExpired:
    print("crun still running after 15 s")
print(subprocess.run(["ps", "-eo", "pid,ppid,pgid,sid,stat,wchan:30,etimes,args", "--forest"], capture_output=True, text=True).stdout[-6000:])
for p in Path("/proc").iterdir():
    if p.name.isdigit():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
        except OSError:
            continue
        if "nvc-py" in cmd or "crun" in cmd:
            fds = []
            for fd in (p / "fd").iterdir():
                try: fds.append(f"{fd.name}->{os.readlink(fd)}")
                except OSError: pass
            print(p.name, cmd, "|", " ".join(fds)[:600])
for f in ("out", "installed/server.log", "hook.log"):
    q = work / f
    print(f"--- {f}:", q.read_text()[-3000:] if q.exists() else "(none)")
crun.kill()
