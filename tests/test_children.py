"""What the terminal shows of a child: one line, however long the agent's rationale."""

from __future__ import annotations

from ralph_ray.children import one_line


def test_a_rationale_becomes_its_first_sentence_on_one_line() -> None:
    text = (
        "batchnorm (healthy): Add BatchNorm2d after every conv.\n  Normalised activations keep gradients well "
        "scaled. Answers healthy."
    )
    assert one_line(text) == "batchnorm (healthy): Add BatchNorm2d after every conv."
    assert one_line("no full stop at all") == "no full stop at all"
    long = "word " * 60
    assert len(one_line(long)) == 100 and one_line(long).endswith("...") and "\n" not in one_line(long)
