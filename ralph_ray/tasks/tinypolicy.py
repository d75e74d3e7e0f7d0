"""A tiny language-model policy made here, offline: the frozen base of the post-training tasks (task=grpo, task=kto).

The tokenizer is built with `tokenizers` (one token per character of a small alphabet), the model is a
`transformers` Llama a few hundred thousand parameters big, and `base_policy` pre-trains it briefly on a synthetic
task with a checkable answer (two-digit addition: "37+48=" -> "85") so that it is right some of the time and
post-training has room to improve it. The result is cached per content (the same settings give the same bytes),
so later campaigns reuse it.

The engine scores a policy by running it: `exact_match` generates greedily from the held-out prompts, here,
never in the trainer. A trained policy reaches the engine as one flat vector of its weights in the base
architecture's parameter order (`policy_vector`), which a trainer saves with `harness.save_predictions`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import random
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ralph_ray.tasks.base import DataError, Splits

if TYPE_CHECKING:  # torch and transformers load on first use: the task registry imports this module's task
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

ALPHABET = "0123456789+="
PAD, BOS, EOS = "<pad>", "<s>", "</s>"
ENV_CACHE = "RALPH_POLICY_CACHE"  # where pre-trained bases are kept (default ~/.cache/ralph_ray/policies)
POLICY_ZIP = "base_policy.zip"  # the public file a trainer fine-tunes: an HF model folder, zipped
METRIC = {"name": "exact_match", "direction": "max", "kind": "custom"}  # the post-training tasks' metric


@dataclass(frozen=True)
class PolicySpec:
    """The base policy's architecture and its brief pre-training (its content hash names the cache entry)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    max_positions: int = 24
    pretrain_steps: int = 300
    batch: int = 64
    lr: float = 3e-3
    seed: int = 0
    operand_max: int = 100  # operands are 0 .. operand_max - 1
    held_out: int = 200  # selection and test problems each, never in pre-training

    @property
    def key(self) -> str:
        """Content hash of the settings (and the format version)."""
        text = json.dumps({"version": 1, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# -----------------------------------------------------------------------------
# Problems


def all_problems(spec: PolicySpec) -> list[tuple[str, str]]:
    """Every addition problem of the task as (prompt, answer), in a fixed order."""
    n = spec.operand_max
    return [(f"{a}+{b}=", str(a + b)) for a in range(n) for b in range(n)]


def split_problems(spec: PolicySpec) -> tuple[list, list, list]:
    """Train, selection and test problems: disjoint, shuffled with the spec's seed (the base is pre-trained on the
    train part only, so the split belongs to the spec)."""
    problems = all_problems(spec)
    random.Random(spec.seed).shuffle(problems)
    held = spec.held_out
    return problems[2 * held :], problems[:held], problems[held : 2 * held]


# -----------------------------------------------------------------------------
# Tokenizer and model


def tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of ALPHABET plus pad, bos and eos; built locally (no download)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2, **{c: i + 3 for i, c in enumerate(ALPHABET)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 1)])
    core.decoder = decoders.Fuse()  # "8", "5" -> "85" (WordLevel's default would join them with spaces)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    tok.padding_side = "left"  # generation continues the prompt's last token
    return tok


def build(spec: PolicySpec, vocab_size: int) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama (seeded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=spec.max_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config)


def pretrain(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, problems: list, spec: PolicySpec) -> None:
    """Brief supervised pre-training on (prompt, answer) pairs: loss on the answer and its eos only."""
    import torch

    rng = random.Random(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    model.train()
    for _ in range(spec.pretrain_steps):
        batch = rng.sample(problems, spec.batch)
        ids, labels = _supervised(tok, batch)
        loss = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()


def _supervised(tok: PreTrainedTokenizerFast, batch: list) -> tuple:
    """Right-padded token ids of bos + prompt + answer + eos, and labels that mask all but the answer and eos."""
    import torch

    rows = [tok(p + a).input_ids + [tok.eos_token_id] for p, a in batch]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (row, (prompt, _)) in enumerate(zip(rows, batch)):
        ids[i, : len(row)] = torch.tensor(row)
        start = len(tok(prompt).input_ids)
        labels[i, start : len(row)] = torch.tensor(row[start:])
    return ids, labels


# -----------------------------------------------------------------------------
# The cached base


def require() -> None:
    """Raise DataError naming the install line where the post-training libraries are missing."""
    missing = [name for name in ("transformers", "tokenizers", "trl", "peft", "datasets") if not _installed(name)]
    if missing:
        raise DataError(
            f"the post-training tasks need {', '.join(missing)}\n"
            '  fix: pip install -e ".[posttrain]" (transformers, tokenizers, trl, peft, datasets, gguf)'
        )


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def cache_root() -> Path:
    """Where pre-trained bases are kept."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "ralph_ray" / "policies")


def base_policy(spec: PolicySpec) -> Path:
    """The pre-trained base as an HF model folder (config, safetensors weights, tokenizer), cached by content.

    Built once per spec (seeded, single-threaded, so the same settings give the same weights) and written
    atomically: concurrent campaigns either find it complete or build their own copy and one rename wins.
    """
    require()
    import torch

    folder = cache_root() / spec.key
    if (folder / "model.safetensors").exists():
        return folder
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same floating-point sums on every machine size
    try:
        tok = tokenizer()
        model = build(spec, len(tok))
        pretrain(model, tok, split_problems(spec)[0], spec)
    finally:
        torch.set_num_threads(threads)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.key}.", dir=folder.parent))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process finished first: keep its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def zip_folder(folder: Path) -> bytes:
    """A model folder as zip bytes with fixed timestamps (the same folder gives the same bytes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            info = zipfile.ZipInfo(path.name, date_time=(2020, 1, 1, 0, 0, 0))
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def load(folder: Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A policy folder's model (eval mode, on CPU) and tokenizer."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    tok.padding_side = "left"
    return model.eval(), tok


# -----------------------------------------------------------------------------
# A policy as a vector, and the engine's greedy evaluation


def policy_vector(model: LlamaForCausalLM) -> np.ndarray:
    """The model's weights as one float vector in parameter order (tied weights once)."""
    from torch.nn.utils import parameters_to_vector

    return parameters_to_vector(model.parameters()).detach().cpu().float().numpy()


def with_vector(folder: Path, vector: np.ndarray) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The base folder's architecture and tokenizer with a policy's weights; ValueError if they do not fit."""
    import torch
    from torch.nn.utils import vector_to_parameters

    model, tok = load(folder)
    expected = sum(p.numel() for p in model.parameters())
    flat = np.asarray(vector, dtype=np.float64).reshape(-1)
    if flat.size != expected:
        raise ValueError(
            f"a policy is a vector of the base architecture's {expected} weights, got {flat.size}: "
            "save policy_vector(merged model) with harness.save_predictions"
        )
    if not np.all(np.isfinite(flat)):
        raise ValueError("the policy's weights hold NaN or inf")
    vector_to_parameters(torch.tensor(flat, dtype=torch.float32), model.parameters())
    return model, tok


def generate(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, prompts: list[str], max_new_tokens: int
) -> list[str]:
    """Greedy completions of the prompts (text after the prompt, up to eos)."""
    import torch

    batch = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    return tok.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)


def exact_match(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, problems: np.ndarray) -> float:
    """The fraction of (prompt, answer) rows whose greedy completion is exactly the answer."""
    prompts, answers = [str(p) for p in problems[:, 0]], [str(a) for a in problems[:, 1]]
    longest = max(len(a) for a in answers)
    completions = generate(model, tok, prompts, max_new_tokens=longest + 1)
    return float(np.mean([c.strip() == a for c, a in zip(completions, answers)]))


# -----------------------------------------------------------------------------
# The frozen part of the post-training tasks: one owner of their splits and score (each task's prepare.py calls these)


def task_splits(spec: PolicySpec) -> Splits:
    """Train prompts and answers as text, the held-out pairs as the engine's targets, the base policy as a file."""
    train, selection, test = split_problems(spec)
    base = base_policy(spec)
    placeholder = np.zeros((1, 1), dtype=np.int64)  # one "input": the policy is scored as a whole
    return Splits(
        train_x=np.array([p for p, _ in train]),
        train_y=np.array([a for _, a in train]),
        selection_x=placeholder,
        selection_y=np.array([selection]),  # (1, held-out problems, 2): prompt, answer
        test_x=placeholder,
        test_y=np.array([test]),
        files={POLICY_ZIP: zip_folder(base)},
    )


def task_score(spec: PolicySpec, predictions: np.ndarray, targets: np.ndarray) -> float:
    """Exact-match accuracy of the saved policy's greedy completions of the held-out prompts."""
    vector = np.asarray(predictions, dtype=np.float64)
    if vector.ndim != 2 or vector.shape[0] != 1:
        raise ValueError(f"expected the policy's weights as one row (1, N), got shape {vector.shape}")
    model, tok = with_vector(base_policy(spec), vector[0])
    return exact_match(model, tok, np.asarray(targets)[0])
