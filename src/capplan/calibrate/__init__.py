"""`capplan calibrate`: measure real vLLM step times and KV capacity, fit, store.

`runner.py` is the only module that imports vllm (it runs as a script on the GPU host);
`sweep` designs the batch compositions, `fit` turns samples into a `Profile`, `store`
lays profiles out under `calibration/<gpu>/vllm-<version>/<model>/<key>/`.
"""
