"""The load generator's event loop: one asyncio thread that sends requests and reads their
streamed tokens, one thing at a time.

vLLM's AsyncLLM runs in the client's own event loop (vllm/v1/engine/async_llm.py): a
request's `generate` processes its inputs there (AsyncLLM.add_request, InputProcessor.
process_inputs) before the first await, and the loop's `output_handler` task puts each
step's outputs into the requests' queues (vllm/v1/engine/output_processor.py,
RequestOutputCollector.put sets an asyncio.Event), which wakes the requests' coroutines in
the order of the step's outputs. While the loop is sending a request, nothing is read: a
token that reaches the client then is seen when the send is done, and the outputs of steps
that end meanwhile wait in the socket. A closed-loop user whose last token it has just read
sends its next request at once, before the coroutines after it run.

So when a closed-loop wave ends, its users read their last tokens a send apart, and the
other requests' tokens of that step and the next wait behind the sends. Measured on the
validation runner (Llama-3.1-8B BF16, chat at concurrency 16, traced): the engine's decode
steps take 5.24 ms at the median and 5.93 ms at p99, the client's inter-token gaps 5.24 and
7.23 ms; the long gaps are a request's last two, and a wave's last tokens reach the client
0.3-0.6 ms apart, one send each (docs/validation.md, "The twelfth session").

The simulator keeps only the loop's busy time: `client_send_s` a send (SimulationSettings;
0 means every user is its own client and nothing waits). Reading a token takes no time here
(the trace puts it at ~5 us an output).
"""

from __future__ import annotations

import numpy as np

PICTURE_INPUT_TOKEN_S = 21.8e-6
"""vLLM's own time taking in a request's pictures, per image token, before the engine core
has the request: AsyncLLM.add_request processes the multimodal input in the caller's loop
(vllm/v1/engine/async_llm.py, InputProcessor.process_inputs) and the engine-core client
serializes its pixel tensors to the core process (vllm/v1/engine/core_client.py,
vllm/v1/serial_utils.py MsgpackEncoder; a 280-token Gemma 4 picture is 1.9 M float32 pixel
values, 7.7 MB). Measured on the validation runner's traced engine core
(gemma-4-31b-fp8-vision6, pictures whose pixels were drawn before the clock): a lone
picture's request reached the core's input thread 6.9 ms after its send stamp at the median
(6.8 ms at the production vision pool's load), a text request 0.8 ms on every traced engine,
so 6.1 ms a 280-token picture (`python scripts/validation_analysis.py tocore`). It holds the
loop that sends (the load generator's here; `vllm serve`'s API server's in production, where
its image processor's own time on a real picture comes on top and is not measured)."""


class ClientLoop:
    """When the client's event loop is free again."""

    __slots__ = ("free_s", "send_s")

    def __init__(self, send_s: float) -> None:
        self.send_s = send_s
        self.free_s = 0.0

    def send(self, t: float) -> float:
        """A send due at `t` (now or later in simulated time, never before a read already
        made): when it starts. The loop is busy until it is done."""
        start = t if t > self.free_s else self.free_s
        self.free_s = start + self.send_s
        return start

    def hold(self, start: float, seconds: float) -> None:
        """The send that started at `start` also spends `seconds` on its request's pictures
        (the client's own and AsyncLLM's): the loop is busy that much longer."""
        end = start + self.send_s + seconds
        if end > self.free_s:
            self.free_s = end

    def read(self, t: float) -> float:
        """A token that reaches the client at `t`: when the loop reads it."""
        return t if t >= self.free_s else self.free_s


class OutputJitter:
    """The output path's delay: each step's outputs reach the client this much after
    `client_latency_s`, drawn per step (one message carries them all) from an exponential
    distribution of mean `mean_s` (`simulation.output_jitter_s`)."""

    __slots__ = ("_at", "_buf", "_rng", "mean_s")

    def __init__(self, mean_s: float, rng: np.random.Generator) -> None:
        self.mean_s = mean_s
        self._rng = rng
        self._buf: list[float] = []
        self._at = 0

    def draw(self) -> float:
        if self._at == len(self._buf):
            self._buf = self._rng.exponential(self.mean_s, 4096).tolist()
            self._at = 0
        self._at += 1
        return self._buf[self._at - 1]


__all__ = ["ClientLoop", "OutputJitter"]
