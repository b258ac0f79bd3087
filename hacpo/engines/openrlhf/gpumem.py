"""Peak memory of a multi-process job: GPU from NVML (OpenRLHF's PPO path records none, notes §4), host RSS
from the process tree (proportional set sizes).

vLLM engines and DeepSpeed actors are separate Ray processes, so ``torch.cuda.max_memory_allocated`` in any
one of them misses the rest. A thread samples every ``interval_s``: per device, the memory of *this job's*
processes (this process and its descendants: the job's own Ray cluster), so that another job on a shared GPU
is not counted; where NVML names no process of ours (a container whose PIDs NVML does not see), the device's
used memory, and the summary says so. Host: the summed PSS of the same process tree (``peak_rss_mb``), and
each process's own peak under its title (Ray names an actor's process ``ray::<Actor class>``), the memory
of every actor and vLLM engine core of the job (``peak_host_mb_per_process``).
Tables 7–8 read the busiest device's peak (``peak_gpu_mem_mb``) against ``gpu_total_mb``, else RSS.
"""

from __future__ import annotations

import threading
from pathlib import Path


class MemorySampler:
    """``with MemorySampler() as s: ...`` then ``s.summary()``; without NVML (no driver, CPU machine) the
    summary says so and holds no numbers."""

    def __init__(self, interval_s: float = 1.0, nvml=None):
        self.interval_s = interval_s
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.device_peak_mb: dict[int, float] = {}
        self.device_total_mb: dict[int, float] = {}
        self.process_peak_mb: dict[int, float] = {}
        self.ours_peak_mb: dict[int, float] = {}  # per device: this job's processes only
        self.peak_rss_mb = 0.0
        self.host_peak_mb: dict[int, tuple[float, str]] = {}  # pid → (peak PSS, its title at that peak)
        self.error: str | None = None

    def __enter__(self) -> MemorySampler:
        self._handles = []
        try:
            if self._nvml is None:
                import pynvml as nvml  # nvidia-ml-py, an OpenRLHF dependency

                self._nvml = nvml
            self._nvml.nvmlInit()
            self._handles = [
                self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())
            ]
        except Exception as err:  # noqa: BLE001 -- no NVML: the run goes on, the profile says why
            self.error = f"NVML unavailable: {err}"
            self._nvml = None
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="gpu-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.sample()
            try:
                if self._nvml is not None:
                    self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        mb = 1 / 2**20
        tree = job_processes()
        self.peak_rss_mb = max(self.peak_rss_mb, sum(rss for rss in tree.values()) * mb)
        for pid, used in tree.items():
            if used * mb > self.host_peak_mb.get(pid, (0.0, ""))[0]:
                self.host_peak_mb[pid] = (used * mb, process_title(pid))
        for i, h in enumerate(self._handles):
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(h)
                self.device_total_mb[i] = info.total * mb
                self.device_peak_mb[i] = max(self.device_peak_mb.get(i, 0.0), info.used * mb)
                ours = 0.0
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = getattr(p, "usedGpuMemory", None)
                    if used and p.pid in tree:
                        ours += used * mb
                        self.process_peak_mb[p.pid] = max(self.process_peak_mb.get(p.pid, 0.0), used * mb)
                if ours:
                    self.ours_peak_mb[i] = max(self.ours_peak_mb.get(i, 0.0), ours)
            except Exception as err:  # noqa: BLE001 -- one failed sample must not end the job
                self.error = f"NVML sample failed: {err}"

    def summary(self) -> tuple[dict, dict]:
        """(``peak_rss_mb``, ``peak_gpu_mem_mb`` of the busiest device, ``gpu_total_mb``; the per-device and
        per-process peaks and notes, for :class:`hacpo.runio.Profile`'s ``details``)."""
        host = {
            f"{title} (pid {pid})": round(used, 1)
            for pid, (used, title) in sorted(self.host_peak_mb.items(), key=lambda kv: -kv[1][0])
            if used >= HOST_PROCESS_MIN_MB
        }
        if not self.device_peak_mb:
            note = self.error or "no GPU"
            return {"peak_rss_mb": self.peak_rss_mb, "peak_gpu_mem_mb": None, "gpu_total_mb": None}, {
                "gpu_memory_note": note, "peak_host_mb_per_process": host
            }
        peaks, source = (self.ours_peak_mb, "this job's processes") if self.ours_peak_mb else (
            self.device_peak_mb,
            "device used memory (NVML named no process of this job: other jobs on the GPU count too)",
        )
        busiest = max(peaks, key=peaks.get)
        main = {"peak_rss_mb": self.peak_rss_mb, "peak_gpu_mem_mb": peaks[busiest],
                "gpu_total_mb": self.device_total_mb[busiest]}  # fmt: skip
        return main, {
            "gpu_memory_source": source,
            "peak_gpu_mem_mb_per_device": {str(i): v for i, v in sorted(peaks.items())},
            "device_used_peak_mb": {str(i): v for i, v in sorted(self.device_peak_mb.items())},
            "peak_gpu_mem_mb_per_process": {str(p): v for p, v in sorted(self.process_peak_mb.items())},
            "peak_host_mb_per_process": host,
        }


HOST_PROCESS_MIN_MB = 100.0  # smaller processes (ray's own daemons, shells) are left out of the summary


def process_title(pid: int) -> str:
    """A process's title: Ray's ``ray::HacpoPolicyActor`` (its method suffix dropped), vLLM's
    ``VLLM::EngineCore``, else the program and its module (``python -m …``)."""
    import psutil

    try:
        args = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "?"
    if not args:
        return "?"
    if args[0].startswith(("ray::", "VLLM::")):
        return args[0].split(".", 1)[0].split(" ", 1)[0]
    if "-m" in args[:-1]:
        return f"{Path(args[0]).name} -m {args[args.index('-m') + 1]}"
    return Path(args[0]).name


def job_processes() -> dict[int, int]:
    """PID → memory bytes of this process and all its descendants (the job's Ray cluster included): the
    proportional set size where the OS gives it (shared libraries and shared memory counted once across the
    processes, not once per process as RSS would), else RSS."""
    import psutil  # a Ray dependency

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            info = p.memory_full_info()
            out[p.pid] = getattr(info, "pss", info.rss)
        except psutil.AccessDenied:
            try:
                out[p.pid] = p.memory_info().rss
            except psutil.Error:
                continue
        except psutil.Error:
            continue
    return out
