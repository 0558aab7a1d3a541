"""A tiny Llama the real-engine tests run: random weights made here and saved as local
safetensors (no hub, no download), and prompts of token ids (no tokenizer).

Weights are drawn wider than transformers' default (initializer_range 0.2, not 0.02): with
near-zero weights every position attends almost uniformly and the sampled tokens barely
depend on the KV cache, so a test that corrupts loaded KV could not see it."""

import json
import os
import random

# One vLLM block of this model: 4 layers x 32 tokens x 4 KV heads x 64 x (K + V) x fp32.
LAYERS = 4
TOKENS_PER_BLOCK = 32  # the CPU attention backend wants a multiple of 32
BLOCK_BYTES = LAYERS * TOKENS_PER_BLOCK * 4 * 64 * 2 * 4
VOCAB = 512
PREFIX_BLOCKS = 4


def make(path: str, layers: int = LAYERS, hidden: int = 256, intermediate: int = 512,
         heads: int = 4, kv_heads: int = 4, max_positions: int = 16384, seed: int = 0) -> str:
    """Writes the model directory (config.json, safetensors, a tokenizer) and returns its
    path. The defaults are the tests' model; the TTFT benchmark (bench/ttft) makes a larger
    one with the same code. Another seed: other weights of the same architecture, as a
    fine-tune of the same base model has."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                         initializer_range=0.2, tie_word_embeddings=False)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


# The hybrid model: Gemma 3's layout, sliding-window layers between full-attention ones.
SLIDING_WINDOW = 64


def make_hybrid(path: str) -> str:
    """A tiny Gemma 3 (text) with the tests' sizes: layers 0 and 2 attend to the last
    SLIDING_WINDOW tokens, 1 and 3 to all. vLLM keeps such a model's KV in two cache groups
    over shared tensors (a tensor row holds one layer of each group), so the connector
    offloads each group's blocks under keys of its own. Untied output embeddings: with
    Gemma's tied ones the argmax is the input token, whatever the KV says."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
        initializer_range=0.2, tie_word_embeddings=False, sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2))
    Gemma3ForCausalLM(config).to(torch.float32).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


def block_bytes(path: str) -> int:
    """Bytes of one vLLM block (all layers, K and V, fp32) of the model saved at path."""
    c = json.loads(open(os.path.join(path, "config.json")).read())
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return (c["num_hidden_layers"] * TOKENS_PER_BLOCK * c["num_key_value_heads"] * head_dim
            * 2 * 4)


def _tokenizer():
    """A word-level tokenizer whose words are the token ids: "t17 t4" is [17, 4]. vLLM's
    OpenAI server tokenizes text prompts with it, and prompt_text() writes them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0")


def prompt_text(doc: int, question: int) -> str:
    return " ".join(f"t{i}" for i in prompt(doc, question))


def prompt(doc: int, question: int) -> list[int]:
    """Document `doc` (PREFIX_BLOCKS full blocks, shared by every question about it) and a
    5-token question: the partial last block is never offloaded."""
    r = random.Random(doc)
    prefix = [r.randrange(1, VOCAB) for _ in range(PREFIX_BLOCKS * TOKENS_PER_BLOCK)]
    return prefix + [(question * 7 + j) % (VOCAB - 1) + 1 for j in range(5)]


def random_prompt(tokens: int, seed: int) -> list[int]:
    """A prompt of `tokens` random token ids, the same for the same seed (the TTFT
    benchmark's long prompts)."""
    r = random.Random(seed)
    return [r.randrange(1, VOCAB) for _ in range(tokens)]
