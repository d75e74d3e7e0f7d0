"""Does llama.cpp run the exported GGUF as the Hugging Face policy runs? Logits and greedy answers side by side.

    pip install llama-cpp-python       # builds llama.cpp from source (~20 min on 2 cores); not a dependency
    python bench/gguf_llamacpp.py [N]  # N held-out problems (default 200: the test split)

The post-training tasks export their best policy as `policy.gguf` (ralph_ray.policyexport.write_gguf, the `gguf`
package's writer). This loads that file in llama.cpp (through llama-cpp-python) and compares, on the task's held-out
test problems: the next-token logits after each prompt (max absolute difference against the HF model in float32),
the greedy completions (llama.cpp's own greedy decoding vs `tinypolicy.generate`), and llama.cpp's tokenizer on the
prompt text against the HF tokenizer's ids. The policy is the shipped grpo task's base (pre-trained, cached).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import save

from ralph_ray import PROJECT_ROOT
from ralph_ray.policyexport import export_policy
from ralph_ray.tasks import tinypolicy
from ralph_ray.tasks.folder import prepare_module

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def llama_greedy(llm, ids: list[int], eos: int, max_new: int) -> tuple[list[int], np.ndarray]:  # noqa: ANN001
    """llama.cpp's greedy continuation of `ids` (token ids, bos included) and its logits after the prompt."""
    llm.reset()
    llm.eval(ids)
    first = np.array(llm.eval_logits[-1], dtype=np.float32)
    out: list[int] = []
    logits = first
    for _ in range(max_new):
        token = int(np.argmax(logits))
        if token == eos:
            break
        out.append(token)
        llm.eval([token])
        logits = np.array(llm.eval_logits[-1], dtype=np.float32)
    return out, first


def main() -> None:
    import torch
    from llama_cpp import Llama

    spec = prepare_module(PROJECT_ROOT / "trainers" / "grpo").SPEC
    base = tinypolicy.base_policy(spec)
    model, tok = tinypolicy.load(base)
    out = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    exported = export_policy(base, tinypolicy.policy_vector(model), out / "policy")
    _, _, test = tinypolicy.split_problems(spec)
    problems = test[:N]
    longest = max(len(a) for _, a in problems) + 1

    start = time.perf_counter()
    llm = Llama(model_path=str(exported.gguf), n_ctx=spec.max_positions, logits_all=True, verbose=False)
    load_s = time.perf_counter() - start
    hf_answers = tinypolicy.generate(model, tok, [p for p, _ in problems], max_new_tokens=longest)

    max_diff, same_argmax, same_greedy, same_tokens, correct_hf, correct_cpp = 0.0, 0, 0, 0, 0, 0
    for (prompt, answer), hf_answer in zip(problems, hf_answers, strict=True):
        ids = tok(prompt).input_ids  # bos + one id per character
        with torch.no_grad():
            hf_logits = model(torch.tensor([ids])).logits[0, -1].numpy()
        cpp_ids, cpp_logits = llama_greedy(llm, ids, tok.eos_token_id, longest)
        cpp_answer = tok.decode(cpp_ids, skip_special_tokens=True)
        max_diff = max(max_diff, float(np.max(np.abs(hf_logits - cpp_logits))))
        same_argmax += int(np.argmax(hf_logits) == np.argmax(cpp_logits))
        same_greedy += int(cpp_answer.strip() == hf_answer.strip())
        correct_hf += int(hf_answer.strip() == answer)
        correct_cpp += int(cpp_answer.strip() == answer)
        same_tokens += int(llm.tokenize(prompt.encode(), add_bos=True, special=False) == ids)

    n = len(problems)
    figures = {
        "problems": n,
        "gguf_bytes": exported.gguf.stat().st_size,
        "llama_cpp_load_s": round(load_s, 3),
        "max_abs_logit_diff": round(max_diff, 6),
        "same_next_token": same_argmax,
        "same_greedy_answer": same_greedy,
        "exact_match_hf": round(correct_hf / n, 4),
        "exact_match_llama_cpp": round(correct_cpp / n, 4),
        "llama_cpp_tokenizer_matches_hf": same_tokens,
    }
    lines = [
        f"The grpo task's base policy exported as GGUF ({figures['gguf_bytes']:,} bytes), run by llama.cpp "
        f"(llama-cpp-python) against Hugging Face transformers on {n} held-out test problems:",
        f"  loads in llama.cpp: yes ({load_s:.2f} s)",
        f"  next-token logits after each prompt: max |HF - llama.cpp| = {max_diff:.2e}; same argmax {same_argmax}/{n}",
        f"  greedy answers identical: {same_greedy}/{n}; exact match HF {correct_hf / n:.3f}, "
        f"llama.cpp {correct_cpp / n:.3f}",
        f"  llama.cpp's tokenizer gives the HF ids for the prompt: {same_tokens}/{n}",
    ]
    save("gguf_llamacpp", figures, lines)


if __name__ == "__main__":
    main()
