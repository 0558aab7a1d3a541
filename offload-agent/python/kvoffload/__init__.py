"""Python side of libkvoffload: a ctypes binding of the C API (engine), the webhook's
environment contract (settings), a vLLM-free transfer core over torch tensors (transfer), and
the vLLM OffloadingConnector spec (kvoffload.vllm, imported only by vLLM)."""
