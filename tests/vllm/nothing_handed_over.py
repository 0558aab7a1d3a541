"""A vLLM KV connector that never has anything to load and stores nothing: what a decode pod's
NixlConnector is to a request that no prefill pod handed over. test_real_engine.py runs it
first in a MultiConnector with ours second, as KServe's P/D sample composes NixlConnector and
OffloadingConnector (vLLM's ExampleConnector cannot stand in: it saves whatever its role)."""

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                              KVConnectorMetadata)


class NothingMetadata(KVConnectorMetadata):
    pass


class NothingHandedOver(KVConnectorBase_V1):
    """Counts the lookups it answered with nothing (in the scheduler's process)."""

    lookups = 0

    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self):
        pass

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        NothingHandedOver.lookups += 1
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        assert num_external_tokens == 0, "nothing was handed over to load"

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return NothingMetadata()
