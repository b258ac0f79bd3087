"""Peak GPU memory of a multi-process job, from NVML (OpenRLHF's PPO path records none, notes §4).

vLLM engines and DeepSpeed actors are separate Ray processes, so ``torch.cuda.max_memory_allocated`` in any
one of them misses the rest. A thread samples NVML every ``interval_s``: the used memory of each device and of
each process on it. Tables 7–8 read the per-device peak (``peak_gpu_mem_mb``) against ``gpu_total_mb``.
"""

from __future__ import annotations

import threading


class GpuMemorySampler:
    """``with GpuMemorySampler() as s: ...`` then ``s.summary()``; without NVML (no driver, CPU machine) the
    summary says so and holds no numbers."""

    def __init__(self, interval_s: float = 1.0, nvml=None):
        self.interval_s = interval_s
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.device_peak_mb: dict[int, float] = {}
        self.device_total_mb: dict[int, float] = {}
        self.process_peak_mb: dict[int, float] = {}
        self.error: str | None = None

    def __enter__(self) -> GpuMemorySampler:
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
            return self
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
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        mb = 1 / 2**20
        for i, h in enumerate(self._handles):
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(h)
                self.device_total_mb[i] = info.total * mb
                self.device_peak_mb[i] = max(self.device_peak_mb.get(i, 0.0), info.used * mb)
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = getattr(p, "usedGpuMemory", None)
                    if used:
                        self.process_peak_mb[p.pid] = max(self.process_peak_mb.get(p.pid, 0.0), used * mb)
            except Exception as err:  # noqa: BLE001 -- one failed sample must not end the job
                self.error = f"NVML sample failed: {err}"

    def summary(self) -> dict:
        """``peak_gpu_mem_mb`` (the busiest device's peak), ``gpu_total_mb``, per device and per process."""
        if not self.device_peak_mb:
            return {"peak_gpu_mem_mb": None, "gpu_total_mb": None, "gpu_memory_note": self.error}
        busiest = max(self.device_peak_mb, key=self.device_peak_mb.get)
        return {
            "peak_gpu_mem_mb": self.device_peak_mb[busiest],
            "gpu_total_mb": self.device_total_mb[busiest],
            "peak_gpu_mem_mb_per_device": {str(i): v for i, v in sorted(self.device_peak_mb.items())},
            "peak_gpu_mem_mb_per_process": {str(p): v for p, v in sorted(self.process_peak_mb.items())},
        }
