"""Seed trainer of task=kto: KTO post-training of a tiny pre-trained policy with a LoRA adapter (TRL + PEFT).

The policy (a small Llama the task's frozen prepare built and pre-trained on two-digit addition, "37+48=" -> "85")
arrives as the public file base_policy.zip. KTO learns from unpaired examples, each labelled desirable or
undesirable; this script makes them offline, from the training problems, once per epoch: it samples
SAMPLES_PER_PROMPT completions of PROMPTS_PER_EPOCH training prompts from the current policy, labels exact answers
desirable and the rest undesirable, adds each prompt's true answer as a desirable example, and trains the LoRA
adapter on them with TRL's KTOTrainer for one pass (the reference is the frozen base policy throughout). At the end
it merges the adapter into the policy and saves the merged weights as its predictions: the engine, not this script,
generates greedily from held-out prompts and scores exact matches.

Hardware: CPU by default (a trial in tens of seconds on 2 cores); on a GPU bf16 and more prompts per epoch.
Run by hand: `python -m ralph_ray.prepare task=kto`, the `export RALPH_DATA_DIR=...` line it prints, then
`python train.py`.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for the Hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import logging
import random
import statistics
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from ralph_ray import harness

# -----------------------------------------------------------------------------
# Knobs (the engine rewrites these constants in each trial's copy)
LR = 0.0005  # AdamW learning rate of the LoRA weights
LORA_RANK = 8  # LoRA rank r
LORA_ALPHA = 16  # LoRA scaling alpha (the update is scaled by alpha / r)
LORA_DROPOUT = 0.0  # dropout on the LoRA path
BETA = 1.0  # KTO's beta: the scale of the implied reward (at 0.1 this tiny policy unlearns its answers)
DESIRABLE_WEIGHT = 2.0  # weight of the desirable examples' loss (they are the fewer: about a third)
UNDESIRABLE_WEIGHT = 1.0  # weight of the undesirable examples' loss
PROMPTS_PER_EPOCH = 32  # training prompts sampled from the current policy each epoch
SAMPLES_PER_PROMPT = 4  # completions sampled per prompt, each labelled desirable (exact answer) or undesirable
TRUE_ANSWERS = 1  # 1: each prompt's true answer joins as a desirable example; 0: the policy's own samples only
TEMPERATURE = 1.0  # sampling temperature of the completions
MAX_NEW_TOKENS = 4  # longest completion sampled (answers are at most 3 digits)
BATCH_SIZE = 16  # examples per optimizer step (KTO estimates its KL term from mismatched pairs in a batch: >= 2)
PASSES = 1  # passes over each epoch's examples
EPOCHS = 4  # epochs (reports); ignored under a time budget
VAL_PROMPTS = 200  # train problems held back for the per-epoch validation accuracy
GPU_PROMPT_FACTOR = 4  # on a GPU, this many times more prompts per epoch (and bf16)

# -----------------------------------------------------------------------------
# Policy


def load_policy(folder: Path):
    """The base policy (model and tokenizer) from the task's public zip, unpacked into the work dir."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    with zipfile.ZipFile(harness.public_file("base_policy.zip")) as archive:
        archive.extractall(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.padding_side = "left"
    return model, tokenizer


def complete(model, tokenizer, prompts: list[str], samples: int, temperature: float | None) -> list[str]:
    """`samples` completions per prompt (prompt-major order); temperature None means greedy."""
    model.eval()
    batch = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    sampling = {"do_sample": False} if temperature is None else {"do_sample": True, "temperature": temperature}
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=MAX_NEW_TOKENS,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
    model.train()
    texts = tokenizer.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)
    return [t.strip() for t in texts]


def greedy_accuracy(model, tokenizer, prompts: list[str], answers: list[str]) -> float:
    """Exact-match accuracy of greedy completions (this script's own validation; the engine scores separately)."""
    return float(np.mean([c == a for c, a in zip(complete(model, tokenizer, prompts, 1, None), answers)]))


# -----------------------------------------------------------------------------
# Examples: unpaired, labelled by exact match, made from the current policy's own samples


def make_examples(model, tokenizer, prompts: list[str], answers: list[str], rng: np.random.Generator):
    """This epoch's KTO examples (prompt, completion, label), shuffled, and the telemetry of the samples."""
    completions = complete(model, tokenizer, prompts, SAMPLES_PER_PROMPT, TEMPERATURE)
    rows, per_prompt = [], []
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        mine = completions[i * SAMPLES_PER_PROMPT : (i + 1) * SAMPLES_PER_PROMPT]
        right = [c == answer for c in mine]
        per_prompt.append(right)
        rows += [(prompt, c, ok) for c, ok in zip(mine, right)]
        if TRUE_ANSWERS:
            rows.append((prompt, answer, True))
    rows = [rows[i] for i in rng.permutation(len(rows))]  # KTO reads its batches in order: mix prompts and labels
    telemetry = {
        "reward_mean": float(np.mean(per_prompt)),  # the fraction of sampled completions that are exact
        "reward_std": float(np.mean([np.std(r) for r in per_prompt])),  # the spread within a prompt's samples
        "zero_spread_frac": float(np.mean([len(set(r)) == 1 for r in per_prompt])),
        "completion_length": float(np.mean([len(c) for c in completions])),
        "desirable_frac": float(np.mean([ok for _, _, ok in rows])),
    }
    return rows, telemetry


# -----------------------------------------------------------------------------
# Telemetry: the mean of TRL's per-step logs over one epoch, under the names the curves use

TELEMETRY = {
    "kl": "kl",
    "entropy": "entropy",
    "rewards/margins": "kto_margin",
    "rewards/chosen": "kto_reward_desirable",
    "rewards/rejected": "kto_reward_undesirable",
    "loss": "train_loss",
}


def epoch_means(log_history: list[dict]) -> dict[str, float]:
    """TRL's logged values averaged over the epoch's steps."""
    return {
        name: statistics.fmean(log[key] for log in log_history if key in log)
        for key, name in TELEMETRY.items()
        if any(key in log for log in log_history)
    }


# -----------------------------------------------------------------------------
# Training


def main() -> None:
    from datasets import Dataset, disable_progress_bars
    from peft import LoraConfig, get_peft_model
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import KTOConfig, KTOTrainer

    hf_logging.set_verbosity_error()  # the epoch reports say it shorter than each epoch's trainer and its bars
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    logging.getLogger("trl").setLevel(logging.ERROR)  # its per-epoch weight advice: desirable_frac is in the reports
    seed = harness.seed()
    random.seed(seed)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    device = harness.device()
    on_gpu = device.startswith("cuda")
    data = harness.load_data()
    prompts, answers = [str(p) for p in data.train_x], [str(a) for a in data.train_y]
    order = rng.permutation(len(prompts))
    held = min(VAL_PROMPTS, len(prompts) // 5)  # a smoke run's sliver of the data is smaller than VAL_PROMPTS
    val, train = order[:held], order[held:]
    val_prompts, val_answers = [prompts[i] for i in val], [answers[i] for i in val]
    per_epoch = min(len(train), PROMPTS_PER_EPOCH * (GPU_PROMPT_FACTOR if on_gpu else 1))

    model, tokenizer = load_policy(Path("policy"))
    reference = type(model).from_pretrained("policy").to(device)  # the frozen base: KTO's reference, every epoch
    lora = LoraConfig(
        r=LORA_RANK,
        lora_alpha=LORA_ALPHA,
        lora_dropout=LORA_DROPOUT,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        task_type="CAUSAL_LM",
    )
    policy = get_peft_model(model, lora).to(device)

    for epoch in harness.epochs(EPOCHS):
        started = time.perf_counter()
        picked = rng.choice(train, size=per_epoch, replace=False)
        rows, sampled = make_examples(
            policy, tokenizer, [prompts[i] for i in picked], [answers[i] for i in picked], rng
        )
        dataset = Dataset.from_dict(
            {"prompt": [r[0] for r in rows], "completion": [r[1] for r in rows], "label": [r[2] for r in rows]}
        )
        config = KTOConfig(
            output_dir="kto_out",
            learning_rate=LR,
            per_device_train_batch_size=BATCH_SIZE,
            num_train_epochs=PASSES,
            beta=BETA,
            desirable_weight=DESIRABLE_WEIGHT,
            undesirable_weight=UNDESIRABLE_WEIGHT,
            max_length=32,
            gradient_checkpointing=False,  # a tiny model: recomputing activations costs more than it saves
            lr_scheduler_type="constant",
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=not on_gpu,
            bf16=on_gpu,
            seed=seed + epoch,
            disable_tqdm=True,
            dataloader_num_workers=0,
            dataloader_drop_last=True,  # a last batch of one example has no mismatched pair for KTO's KL term
        )
        # A trainer per epoch: its data is the current policy's samples. The adapter carries over; AdamW restarts.
        trainer = KTOTrainer(
            model=policy, ref_model=reference, args=config, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        harness.report(
            epoch=epoch,
            val_acc=greedy_accuracy(policy, tokenizer, val_prompts, val_answers),
            lr=LR,
            epoch_seconds=time.perf_counter() - started,
            examples=len(rows),
            **sampled,
            **epoch_means(trainer.state.log_history),
        )

    # The policy the engine scores: the adapter merged into the base, as one vector in the base's parameter order.
    merged = policy.merge_and_unload().float().cpu()
    weights = torch.nn.utils.parameters_to_vector(merged.parameters()).detach().numpy()[None, :]
    harness.save_predictions(selection=weights, test=weights)


if __name__ == "__main__":
    main()
