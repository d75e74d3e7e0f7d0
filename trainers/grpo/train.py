"""Seed trainer of task=grpo: GRPO post-training of a tiny pre-trained policy with a LoRA adapter (TRL + PEFT).

The policy (a small Llama the task's frozen prepare built and pre-trained on two-digit addition, "37+48=" -> "85")
arrives as the public file base_policy.zip. This script samples GROUP_SIZE completions per training prompt,
rewards them with the functions below (exact answer, format, length), and updates a LoRA adapter with TRL's
GRPOTrainer. At the end it merges the adapter into the policy and saves the merged weights as its predictions:
the engine, not this script, generates greedily from held-out prompts and scores exact matches.

Hardware: CPU by default (a campaign of a few cycles in minutes on 2 cores); on a GPU bf16 and larger groups.
Run by hand: `python -m ralph_ray.prepare task=grpo`, the `export RALPH_DATA_DIR=...` line it prints, then
`python train.py`.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for the Hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
LR = 0.002  # AdamW learning rate of the LoRA weights
LORA_RANK = 8  # LoRA rank r
LORA_ALPHA = 16  # LoRA scaling alpha (the update is scaled by alpha / r)
LORA_DROPOUT = 0.0  # dropout on the LoRA path
GROUP_SIZE = 8  # completions sampled per prompt (GRPO's group; its rewards are compared within the group)
PROMPTS_PER_STEP = 4  # distinct prompts per optimizer step
BETA = 0.02  # KL coefficient against the frozen base policy (0: no reference model, cheaper)
TEMPERATURE = 1.0  # sampling temperature of the group's completions
MAX_NEW_TOKENS = 4  # longest completion sampled (answers are at most 3 digits)
CORRECT_WEIGHT = 1.0  # weight of the exact-answer reward
FORMAT_WEIGHT = 0.2  # weight of the format reward (digits only)
LENGTH_WEIGHT = 0.1  # weight of the length penalty (completion longer than the answer)
EPOCHS = 3  # epochs (reports); ignored under a time budget
STEPS_PER_EPOCH = 8  # GRPO optimizer steps per epoch
VAL_PROMPTS = 200  # train problems held back for the per-epoch validation accuracy
GPU_GROUP_FACTOR = 4  # on a GPU, groups this many times larger (and bf16)

# -----------------------------------------------------------------------------
# Rewards: each returns one float per completion; GRPO weighs them with REWARD_WEIGHTS


def correct_reward(prompts: list[str], completions: list[str], answer: list[str], **_: object) -> list[float]:
    """1.0 when the completion is exactly the answer."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


def format_reward(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    """1.0 when the completion is a plain number (digits only, no operators)."""
    return [1.0 if c.strip().isdigit() else 0.0 for c in completions]


def length_reward(prompts: list[str], completions: list[str], answer: list[str], **_: object) -> list[float]:
    """Minus the number of characters past the answer's length."""
    return [-float(max(0, len(c.strip()) - len(a))) for c, a in zip(completions, answer)]


REWARD_FUNCS = [correct_reward, format_reward, length_reward]
REWARD_WEIGHTS = [CORRECT_WEIGHT, FORMAT_WEIGHT, LENGTH_WEIGHT]

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


def greedy_accuracy(model, tokenizer, prompts: list[str], answers: list[str]) -> float:
    """Exact-match accuracy of greedy completions (this script's own validation; the engine scores separately)."""
    model.eval()
    batch = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=0)
    texts = tokenizer.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)
    model.train()
    return float(np.mean([t.strip() == a for t, a in zip(texts, answers)]))


# -----------------------------------------------------------------------------
# Telemetry: one report per epoch with the mean of TRL's per-step logs (reward, its spread, KL, length, entropy)

TELEMETRY = {
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "kl": "kl",
    "entropy": "entropy",
    "completions/mean_length": "completion_length",
    "frac_reward_zero_std": "zero_spread_frac",
    "loss": "train_loss",
}


def make_reporter(epochs, val_prompts, val_answers, tokenizer):
    """A TrainerCallback that reports each epoch of STEPS_PER_EPOCH steps and stops when `epochs` ends."""
    from transformers import TrainerCallback

    class Reporter(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict] = []
            self.epoch = next(epochs)
            self.started = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.logs.append(dict(logs))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % STEPS_PER_EPOCH:
                return
            means = {
                name: statistics.fmean(log[key] for log in self.logs if key in log)
                for key, name in TELEMETRY.items()
                if any(key in log for log in self.logs)
            }
            self.logs = []
            harness.report(
                epoch=self.epoch,
                val_acc=greedy_accuracy(model, tokenizer, val_prompts, val_answers),
                lr=state.log_history[-1].get("learning_rate", LR) if state.log_history else LR,
                epoch_seconds=time.perf_counter() - self.started,
                **means,
            )
            self.started = time.perf_counter()
            try:
                self.epoch = next(epochs)
            except StopIteration:
                control.should_training_stop = True

    return Reporter()


# -----------------------------------------------------------------------------
# Training


def main() -> None:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    seed = harness.seed()
    random.seed(seed)
    torch.manual_seed(seed)
    device = harness.device()
    on_gpu = device.startswith("cuda")
    data = harness.load_data()
    prompts, answers = [str(p) for p in data.train_x], [str(a) for a in data.train_y]
    order = np.random.default_rng(seed).permutation(len(prompts))
    held = min(VAL_PROMPTS, len(prompts) // 5)  # a smoke run's sliver of the data is smaller than VAL_PROMPTS
    val, train = order[:held], order[held:]
    val_prompts, val_answers = [prompts[i] for i in val], [answers[i] for i in val]
    dataset = Dataset.from_dict({"prompt": [prompts[i] for i in train], "answer": [answers[i] for i in train]})

    model, tokenizer = load_policy(Path("policy"))
    group = GROUP_SIZE * (GPU_GROUP_FACTOR if on_gpu else 1)
    config = GRPOConfig(
        output_dir="grpo_out",
        learning_rate=LR,
        per_device_train_batch_size=PROMPTS_PER_STEP * group,
        num_generations=group,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        beta=BETA,
        reward_weights=REWARD_WEIGHTS,
        max_steps=EPOCHS * STEPS_PER_EPOCH if harness.budget_s() is None else 10**6,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not on_gpu,
        bf16=on_gpu,
        seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(
        r=LORA_RANK,
        lora_alpha=LORA_ALPHA,
        lora_dropout=LORA_DROPOUT,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        task_type="CAUSAL_LM",
    )
    reporter = make_reporter(harness.epochs(EPOCHS), val_prompts, val_answers, tokenizer)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=REWARD_FUNCS,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[reporter],
    )
    trainer.remove_callback(PrinterCallback)  # the epoch reports say it shorter
    trainer.train()

    # The policy the engine scores: the adapter merged into the base, as one vector in the base's parameter order.
    merged = trainer.model.merge_and_unload().float().cpu()
    weights = torch.nn.utils.parameters_to_vector(merged.parameters()).detach().numpy()[None, :]
    harness.save_predictions(selection=weights, test=weights)


if __name__ == "__main__":
    main()
