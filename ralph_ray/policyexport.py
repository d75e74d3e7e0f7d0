"""Export a post-trained policy (task=grpo, task=kto): a Hugging Face model folder, a GGUF file and an Ollama Modelfile.

`python -m ralph_ray.policyexport RUN_ID [VARIANT] [--kb KB] [--out DIR]` writes the variant's bundle (as
`python -m ralph_ray export` does) and, beside it, `policy/`: the best trial's policy (the LoRA adapter already
merged by the trainer) as an HF folder (`hf/`: config, safetensors, tokenizer), `policy.gguf` written with the
`gguf` package's writer (llama architecture, f32, tensor names from gguf's own HF-to-GGUF name map, the query and
key weights permuted as llama.cpp's converter does), and a `Modelfile` for `ollama create`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ralph_ray import sql
from ralph_ray.kb import open_reader
from ralph_ray.tasks import tinypolicy

GGUF_FILE = "policy.gguf"
MODELFILE = """# Ollama: ollama create ralph-policy -f Modelfile && ollama run ralph-policy "37+48="
FROM ./{gguf}
TEMPLATE "{{{{ .Prompt }}}}"
PARAMETER temperature 0
PARAMETER num_predict {max_new_tokens}
PARAMETER stop "</s>"
"""


class PolicyExportError(ValueError):
    """A run or variant whose policy cannot be exported; the message names the fix."""


@dataclass(frozen=True)
class ExportedPolicy:
    """Where an exported policy's parts are."""

    hf: Path
    gguf: Path
    modelfile: Path


def export_policy(base: Path, vector: np.ndarray, out: Path, max_new_tokens: int = 4) -> ExportedPolicy:
    """Write the policy (the base architecture with `vector`'s weights) as an HF folder, a GGUF file and a Modelfile."""
    model, tok = tinypolicy.with_vector(base, vector)
    hf = out / "hf"
    model.save_pretrained(hf)
    tok.save_pretrained(hf)
    gguf_path = out / GGUF_FILE
    write_gguf(model, tok, gguf_path)
    modelfile = out / "Modelfile"
    modelfile.write_text(MODELFILE.format(gguf=GGUF_FILE, max_new_tokens=max_new_tokens))
    return ExportedPolicy(hf, gguf_path, modelfile)


def write_gguf(model, tok, path: Path) -> None:  # noqa: ANN001 - a transformers Llama and its tokenizer
    """A llama-architecture GGUF (f32) of an HF Llama, with its character vocabulary as the tokenizer."""
    import gguf

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_name("ralph_ray policy")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_rope_freq_base(float(_rope_theta(config)))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    special = set(tok.all_special_ids)
    # Single characters: llama.cpp's BPE tokenizer splits text into exactly these tokens. llama.cpp refuses a BPE
    # vocabulary without a merges list (and GGUFWriter drops an empty one), so the list holds one merge that can
    # never fire: BPE merges symbols of the text, and no text symbol is a whole special token (bench/gguf_llamacpp.py).
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL) for _, i in vocab])
    writer.add_token_merges([f"{tok.bos_token} {tok.eos_token}"])
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_pad_token_id(tok.pad_token_id)
    writer.add_add_bos_token(True)
    for name, tensor in gguf_tensors(model, names, heads, kv_heads).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_tensors(model, names, heads: int, kv_heads: int) -> dict[str, np.ndarray]:  # noqa: ANN001
    """The model's weights under their GGUF names (f32); a tied output head is left out (llama.cpp reads
    token_embd in its place)."""
    out: dict[str, np.ndarray] = {}
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise PolicyExportError(f"no GGUF name for {hf_name}: the policy is not a plain Llama")
        array = tensor.detach().float().cpu().numpy()
        if hf_name.endswith("q_proj.weight"):
            array = permute(array, heads)
        elif hf_name.endswith("k_proj.weight"):
            array = permute(array, kv_heads)
        out[name] = np.ascontiguousarray(array)
    return out


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotary layout (halves) to GGML's (interleaved pairs), per head: llama.cpp's converter does the same."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _rope_theta(config) -> float:  # noqa: ANN001
    """rope_theta, wherever this transformers version keeps it."""
    if getattr(config, "rope_theta", None) is not None:
        return float(config.rope_theta)
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", 10000.0))


# -----------------------------------------------------------------------------
# The best variant of a campaign


def best_policy(
    kb_root: Path, run_id: str, variant_id: str | None, trial_id: str | None = None
) -> tuple[np.ndarray, Path]:
    """The policy vector the best (or the named) variant's best trial saved (or trial `trial_id`'s: the exported
    bundle's, a final training's where one won), and its task's base folder."""
    from ralph_ray.config import to_config
    from ralph_ray.tasks.folder import prepare_module

    con = open_reader(kb_root)
    run = con.execute(sql.RUN, [run_id]).fetchdf()
    if run.empty:
        raise PolicyExportError(f"no campaign {run_id} in {kb_root}: check the run id and --kb")
    board = (
        con.execute(sql.LEADERBOARD_ROW, [run_id, variant_id])
        if variant_id
        else con.execute(sql.LEADERBOARD_FOR_RUN, [run_id, 1])
    ).fetchdf()
    if board.empty:
        raise PolicyExportError(f"no scored variant {variant_id or '(best)'} in run {run_id}")
    trials = con.execute(sql.TRIALS_FOR_RUN, [run_id]).fetchdf()
    trial = trials[trials["trial_id"] == (trial_id or board.iloc[0]["best_trial_id"])]
    predictions = Path(str(trial.iloc[0]["work_dir"])) / "predictions.npz" if not trial.empty else None
    if predictions is None or not predictions.is_file():
        raise PolicyExportError(
            f"the best trial's predictions.npz is gone ({predictions}): the policy lives in the trial's work dir"
        )
    from omegaconf import OmegaConf

    cfg = to_config(OmegaConf.load(Path(str(run.iloc[0]["run_dir"])) / "config.yaml"))
    spec = getattr(prepare_module(cfg.task_folder()), "SPEC", None)
    if not isinstance(spec, tinypolicy.PolicySpec):
        raise PolicyExportError(f"run {run_id} is task {cfg.task.name}, not a post-training task (task=grpo, kto)")
    with np.load(predictions) as saved:
        vector = np.asarray(saved["selection"])[0]
    return vector, tinypolicy.base_policy(spec)


def main(argv: list[str] | None = None) -> int:
    """Command line: the best variant's bundle plus its policy as HF folder, GGUF and Modelfile."""
    from ralph_ray.export import ExportError, export

    parser = argparse.ArgumentParser(prog="python -m ralph_ray.policyexport", description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("variant", nargs="?")
    parser.add_argument("--kb", type=Path, default=Path("kb"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        bundle = export(args.kb, args.run_id, args.variant, args.out)
        shipped = json.loads((bundle / "scores.json").read_text())["trial_id"]  # the bundle's trial: the same policy
        vector, base = best_policy(args.kb, args.run_id, args.variant, shipped)
        exported = export_policy(base, vector, bundle / "policy")
    except (ExportError, PolicyExportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"policy: {exported.hf}\ngguf: {exported.gguf}\nModelfile: {exported.modelfile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
