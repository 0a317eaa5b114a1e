"""The simulator: requests from a traffic spec, vLLM V1 engines step by step, pools of them."""
