"""Weight formats: int4 layers against a reference product, the default model's Q4_1 blocks as the
file holds them, formats that never share KV, and reuse that still gives full prefill's logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from kvboost_rag import EngineConfig, KVBoostRAG, RepairConfig
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.hf.fingerprint import weight_format
from kvboost_rag.hf.gguf_int4 import q4_1_weights
from kvboost_rag.hf.int4_linear import (
    CUDA_INT4_CAPABILITY,
    INT4_MAX_ROWS,
    Int4Linear,
    fused_int4,
    inner_k_tiles,
    int4_kernel,
    int4_supported,
    nibble_pairs,
    quantize_int4,
)
from kvboost_rag.hf.loader import default_model_gguf
from kvboost_rag.hf.step import step_for
from kvboost_rag.hf.weights import apply_weights


@pytest.fixture(scope="module")
def int4_engine() -> KVBoostRAG:
    """The embedded default as users get it: int4 linear layers from the GGUF's blocks."""
    return KVBoostRAG.from_pretrained(dtype="float32", store="memory")


def test_quantized_weights_are_within_half_a_step() -> None:
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(0))
    int4 = quantize_int4(weight, group_size=32)
    assert int4.codes.dtype == torch.uint8 and int4.codes.max() <= 15
    step = int4.scales.repeat_interleave(32, dim=1)
    assert ((int4.dequantized() - weight).abs() <= step / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="groups of 48"):
        quantize_int4(weight, group_size=48)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_layer_is_the_product_with_its_weights(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    linear = nn.Linear(256, 96, bias=True).to(dtype)
    int4 = quantize_int4(linear.weight, 64)
    layer = Int4Linear(int4, linear.bias, dense=linear)
    few = torch.randn(1, INT4_MAX_ROWS, 256, generator=generator).to(dtype)
    # The kernel holds scales and zeros in bf16 and takes bf16 rows: the reference does the same.
    scales, zeros = int4.scales.bfloat16().float(), int4.zeros.bfloat16().float()
    codes = int4.codes.float().view(96, -1, 64)
    weight = ((codes - 8) * scales.unsqueeze(-1) + zeros.unsqueeze(-1)).view(96, 256)
    expected = few.bfloat16().float() @ weight.t() + linear.bias.float()
    got = layer(few)
    assert got.dtype == dtype and got.shape == (1, INT4_MAX_ROWS, 96)
    assert torch.allclose(got.float(), expected, rtol=2e-2, atol=2e-2)
    many = torch.randn(2, INT4_MAX_ROWS + 1, 256, generator=generator).to(dtype)
    assert torch.equal(layer(many), linear(many)), "past a few rows the dense weight answers"
    alone = Int4Linear(int4, linear.bias)
    assert torch.allclose(alone(many).float(), many.bfloat16().float() @ weight.t() + linear.bias.float(), 2e-2, 2e-2)


def test_cuda_packing_puts_the_even_column_in_the_high_nibble() -> None:
    codes = torch.randint(0, 16, (8, 64), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    pairs = nibble_pairs(codes)
    assert pairs.shape == (8, 32) and pairs.dtype == torch.uint8
    assert torch.equal(pairs >> 4, codes[:, 0::2]) and torch.equal(pairs & 15, codes[:, 1::2])
    assert [inner_k_tiles(n) for n in (128, 576, 1536, 96)] == [8, 4, 8, 2]
    with pytest.raises(ValueError, match="multiple of 32"):
        inner_k_tiles(48)


def test_int4_takes_the_devices_own_kernel_and_names_what_it_lacks() -> None:
    assert int4_kernel(torch.device("cpu")) is torch.ops.aten._weight_int4pack_mm_for_cpu.default
    assert int4_kernel(torch.device("cuda")) is torch.ops.aten._weight_int4pack_mm.default
    assert int4_kernel(torch.device("meta")) is None
    reason = int4_supported(nn.Linear(64, 64, device="meta"))
    assert reason is not None and "CPU or a CUDA GPU" in reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the tinygemm int4 kernel)")
def test_int4_layer_on_cuda_is_the_product_with_its_weights() -> None:
    if torch.cuda.get_device_capability() < CUDA_INT4_CAPABILITY:
        pytest.skip(f"needs CUDA compute capability {CUDA_INT4_CAPABILITY}")
    linear = nn.Linear(576, 192, bias=True)
    int4 = quantize_int4(linear.weight, 32)
    on_gpu = Int4Linear(int4, linear.bias, device="cuda")
    on_cpu = Int4Linear(int4, linear.bias)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(3)).bfloat16()
    got, expected = on_gpu(x.cuda()).cpu().float(), on_cpu(x).float()
    assert torch.allclose(got, expected, rtol=2e-2, atol=2e-2), (got - expected).abs().max()


@pytest.mark.parametrize(("sizes", "fuses"), [((576, 192, 192), True), ((64, 32, 32), None)])
def test_fused_layers_compute_their_parts_side_by_side(sizes: tuple[int, ...], fuses: bool | None) -> None:
    """q, k and v in one product where the parts fill the kernel's row blocks (the default model's
    do); parts that do not (32 rows, with AVX-512 kernels; AVX2's pack them) are left unfused."""
    torch.manual_seed(0)
    parts = [Int4Linear(quantize_int4(nn.Linear(576, n).weight), nn.Linear(576, n).bias) for n in sizes]
    x = torch.randn(1, 1, 576)
    expected = torch.cat([part(x) for part in parts], dim=-1)
    fused = fused_int4(parts)
    assert fuses is None or (fused is not None) == fuses
    if fused is not None:
        assert torch.equal(fused(x), expected)
        assert all(
            p.packed_weight.untyped_storage().data_ptr() == fused.packed_weight.untyped_storage().data_ptr()
            for p in parts
        ), "the parts read the fused weight: held once"
    assert torch.equal(torch.cat([part(x) for part in parts], dim=-1), expected)


def test_default_models_q4_1_blocks_are_the_files_weights(engine: KVBoostRAG) -> None:
    """Dequantized, the int4 weights are the converted folder's to the bit: nothing re-quantized."""
    weights = q4_1_weights(default_model_gguf(), engine.model.config)
    assert len(weights) == 7 * engine.model.config.num_hidden_layers
    for name, int4 in weights.items():
        assert torch.equal(int4.dequantized(), engine.model.base_model.get_submodule(name).weight.float()), name


def test_default_runs_int4_and_reuse_at_rho_one_is_full_prefill(int4_engine: KVBoostRAG, passages: list[str]) -> None:
    assert weight_format(int4_engine.model) == "int4-g32"
    assert sum(isinstance(m, Int4Linear) for m in int4_engine.model.modules()) == 210
    engine = KVBoostRAG(int4_engine.model, int4_engine.tokenizer, EngineConfig(store="memory"))
    documents = passages[30:34]
    engine.warm(documents)
    prompt = rag_messages("Which of these happened first?", documents[::-1])
    full, _ = engine.next_token_logits(prompt, mode="full")
    everything, plan = engine.next_token_logits(prompt, repair=RepairConfig(rho=1.0))
    assert plan.tokens("approximate") > 300
    assert (everything - full).abs().max().item() <= 1e-3
    answer = engine.generate(prompt, max_new_tokens=8)
    assert answer.new_tokens >= 1 and answer.reuse_share > 0.5


def test_weight_formats_never_share_kv(engine: KVBoostRAG, int4_engine: KVBoostRAG, tmp_path: Path) -> None:
    assert engine.fingerprint != int4_engine.fingerprint
    document = "The Treaty of Westphalia was signed in 1648 in Osnabrück and Münster, ending the war. " * 6
    float_store = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(store=str(tmp_path), kv_quantization="dense"))
    float_store.warm(document)
    int4_store = KVBoostRAG(
        int4_engine.model, int4_engine.tokenizer, EngineConfig(store=str(tmp_path), kv_quantization="dense")
    )
    assert int4_store.plan(document + " When was it signed?").tokens("approximate") == 0
    assert float_store.plan(document + " When was it signed?").tokens("exact") > 0


def test_models_without_q4_1_blocks_quantize_only_when_asked(tiny_model_dir: Path) -> None:
    auto = KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory")
    assert weight_format(auto.model) == "float", "bf16 or fp32 weights are kept unless int4 is asked for"
    int4 = KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", weights="int4", store="memory")
    assert weight_format(int4.model) == "int4-g32" and auto.fingerprint != int4.fingerprint
    assert sum(isinstance(m, Int4Linear) for m in int4.model.modules()) == 2 * 7
    assert int4.generate("Hello there", max_new_tokens=4, ignore_eos=True).new_tokens == 4
    assert apply_weights(auto.model, "float", None) == "float"


def test_unknown_weight_format_is_refused_before_loading() -> None:
    with pytest.raises(ValueError, match="weights must be one of"):
        KVBoostRAG.from_pretrained(weights="int3", store="memory")


TORCHAO = Path(__file__).resolve().parents[1] / ".torchao"  # `make install` puts torchao there, not in the venv
HUB_QUANTIZED = """
import json, sys, torch
from torchao.quantization import Int8WeightOnlyConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig
from kvboost_rag import KVBoostRAG
from kvboost_rag.hf.fingerprint import weight_format
tiny, folder = sys.argv[1], sys.argv[2]
quantized = AutoModelForCausalLM.from_pretrained(
    tiny, dtype=torch.float32, quantization_config=TorchAoConfig(Int8WeightOnlyConfig())
)
quantized.save_pretrained(folder, safe_serialization=False)
AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
engine = KVBoostRAG.from_pretrained(folder, dtype="float32", store="memory")
plain = KVBoostRAG.from_pretrained(tiny, dtype="float32", store="memory")
document = "The Treaty of Westphalia was signed in 1648 in Osnabrück and Münster. " * 8
engine.warm(document)
answer = engine.generate("Question: when? " + document, max_new_tokens=5, ignore_eos=True)
try:
    KVBoostRAG.from_pretrained(folder, dtype="float32", weights="int4", store="memory")
    refused = ""
except ValueError as error:
    refused = str(error)
print(json.dumps(dict(format=weight_format(engine.model), own_kv=engine.fingerprint != plain.fingerprint,
    tokens=answer.new_tokens, reuse=answer.reuse_share, refused=refused)))
"""


@pytest.mark.skipif(not (TORCHAO / "torchao").is_dir(), reason="torchao is not in .torchao/ (make install puts it)")
def test_a_model_quantized_the_hubs_way_serves_with_reuse(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A torchao int8 checkpoint (as published on the Hub) loads, keeps its own layers, warms and
    reuses; its KV is its own; asking int4 of it is refused by name. In a process of its own, with
    torchao on its path (transformers imports torchao wherever it is installed)."""
    environment = os.environ | {"PYTHONPATH": os.pathsep.join([str(TORCHAO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", HUB_QUANTIZED, str(tiny_model_dir), str(tmp_path)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["format"] == "torchao" and result["own_kv"]
    assert result["tokens"] == 5 and result["reuse"] > 0.9
    assert "quantized already (torchao)" in result["refused"]


def test_layers_offloaded_to_disk_serve_with_reuse(tiny_model_dir: Path, tmp_path: Path) -> None:
    """accelerate's layer offload (a model larger than memory): the model's own forward runs
    every step (no decode step, nothing packed), and the answer is the resident model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    placement = {name: "cpu" for name in ("model.embed_tokens", "model.layers.0", "model.norm", "model.rotary_emb")}
    offloaded = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir,
        dtype=torch.float32,
        device_map=placement | {"model.layers.1": "disk", "lm_head": "cpu"},
        offload_folder=str(tmp_path),
    ).eval()
    resident = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    document = "The Treaty of Westphalia was signed in 1648 in Osnabrück and Münster. " * 8
    answers = []
    for model in (offloaded, resident):
        engine = KVBoostRAG(model, tokenizer, EngineConfig(store="memory"))
        engine.warm(document)
        answers.append(engine.generate("Q: when? " + document, max_new_tokens=6, ignore_eos=True))
    assert step_for(offloaded) is None
    assert answers[0].token_ids == answers[1].token_ids and answers[0].reuse_share > 0.9


def test_the_kept_blocks_are_rebuilt_when_unreadable(
    engine: KVBoostRAG, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GGUF's blocks are kept once in the cache; a damaged copy is read past and written again."""
    monkeypatch.setenv("KVBOOST_RAG_CACHE_DIR", str(tmp_path))
    first = q4_1_weights(default_model_gguf(), engine.model.config)
    (kept,) = (tmp_path / "models" / "int4").glob("*.safetensors")
    kept.write_bytes(b"not a safetensors file")
    again = q4_1_weights(default_model_gguf(), engine.model.config)
    name = "layers.0.mlp.up_proj"
    assert torch.equal(again[name].codes, first[name].codes) and len(again) == len(first)
    assert kept.stat().st_size > 1_000_000, "written again"
    assert torch.equal(q4_1_weights(default_model_gguf(), engine.model.config)[name].zeros, first[name].zeros)
