"""captum_cw.tasks.context: the ground-truth context tasks say where their answer is, and nothing else does."""

import random

import pytest

from captum_cw.errors import InputError
from captum_cw.tasks.context import (
    CITIES,
    CONTEXT_TASKS,
    JOBS,
    NEUTRAL,
    VERDICTS,
    context_examples,
    encode_context,
    prompt_text,
)

TASKS = sorted(CONTEXT_TASKS)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("distractors", [1, 3, 8])
def test_each_example_has_one_evidence_that_states_the_answer(task, distractors):
    for example in context_examples(task, 20, seed=1, distractors=distractors):
        assert len(example.sources) == distractors + 1
        assert 0 <= example.evidence < len(example.sources)
        assert example.answer in example.candidates
        assert len(set(example.candidates)) == len(example.candidates)
        assert example.prompt == "".join(example.sources) + example.question
        if CONTEXT_TASKS[task].per_source:  # candidate k is what source k answers
            assert example.answer == example.candidates[example.evidence]
        word = example.answer.strip()
        in_sources = [k for k, source in enumerate(example.sources) if word in source]
        if example.copy:  # the answer's word stands in the evidence and in no other source
            assert in_sources == [example.evidence]
            assert example.answer_spans() and all(example.prompt[s:e] == word for s, e in example.answer_spans())
        else:
            assert example.answer_spans() == []  # no copy, even where the letter stands inside a name ("Anna")
            if CONTEXT_TASKS[task].per_source:  # the answer is implied, never stated
                assert in_sources == []


def test_a_choice_letter_names_the_evidence_city_and_every_city_is_an_option():
    for example in context_examples("where_choice", 30, seed=2, distractors=3):
        options = dict(line.split(". ", 1) for line in example.question.splitlines() if line[1:3] == ". ")
        assert sorted(options) == [c.strip() for c in example.candidates] == list("ABCD")
        evidence = example.sources[example.evidence]
        assert evidence.split(" lives in ")[0] in example.question
        assert evidence == f"{evidence.split(' lives in ')[0]} lives in {options[example.answer.strip()]}. "
        assert sorted(options.values()) == sorted(s.split(" lives in ")[1][:-2] for s in example.sources)


def test_a_word_choice_lists_every_source_country_and_the_evidence_city_implies_the_answer():
    for example in context_examples("country_choice", 30, seed=2, distractors=3):
        listed = example.question.split(" live in: ")[1].split("?")[0].replace(" or ", ", ").split(", ")
        assert sorted(listed) == sorted(c.strip() for c in example.candidates)
        name, city = example.sources[example.evidence][:-2].split(" lives in ")
        assert f"does {name} live in" in example.question
        assert example.answer == f" {CITIES[city]}"

def test_a_review_judges_in_its_evidence_alone_and_never_names_the_label():
    examples = context_examples("review_sentiment", 60, seed=2, distractors=3)
    assert {e.answer for e in examples} == {" positive", " negative"}  # both labels occur
    for example in examples:
        assert example.candidates == (" positive", " negative")
        judged = [k for k, source in enumerate(example.sources) if source.strip() not in NEUTRAL]
        assert judged == [example.evidence]
        subject, verdict = next((subject, example.sources[example.evidence].strip()[len(subject) + 1:-1])
                                for subject in VERDICTS if example.sources[example.evidence].startswith(subject))
        assert verdict == VERDICTS[subject][0 if example.answer == " positive" else 1]
        assert not any(label in example.context for label in ("positive", "negative"))
    assert len({e.evidence for e in examples}) == 4  # the evidence stands anywhere


def test_the_factual_sentences_judge_nothing():
    judging = ("good", "bad", "nice", "great", "poor", "sadly", "luckily", "love", "hate", "enjoy", "best", "worst",
               *(word for verdicts in VERDICTS.values() for verdict in verdicts for word in verdict.split()
                 if word not in ("a", "and", "to", "read")))
    for sentence in NEUTRAL:
        assert not any(word.strip(".,").lower() in judging for word in sentence.split()), sentence


@pytest.mark.parametrize("task", TASKS)
def test_examples_are_seeded_and_differ_across_seeds(task):
    first = context_examples(task, 10, seed=3, distractors=2)
    random.seed(7)  # the generators draw from their own seeded generator, never from the global one
    assert first == context_examples(task, 10, seed=3, distractors=2)
    random.seed(8)
    assert first == context_examples(task, 10, seed=3, distractors=2)
    assert first != context_examples(task, 10, seed=4, distractors=2)
    assert [e.id for e in first] == [f"{task}-{k}" for k in range(10)]


def test_the_evidence_is_what_the_question_asks():
    for example in context_examples("who_lives_where", 20, seed=0, distractors=3):
        name = example.question.split(" lives in")[0]
        assert example.sources[example.evidence] == f"{name} lives in {example.answer.strip()}. "
    for example in context_examples("job_of_description", 20, seed=0, distractors=3):
        name = example.question.split(" works as a")[0]
        assert example.sources[example.evidence] == f"{name} {JOBS[example.answer.strip()]}. "


def test_job_descriptions_never_name_the_job():
    for job, description in JOBS.items():
        assert job[:4] not in description, (job, description)
        assert not any(other[:4] in description for other in JOBS), description


def test_bad_arguments_are_refused_with_the_choices():
    with pytest.raises(InputError, match="Unknown context task 'nope'; choose one of who_lives_where"):
        context_examples("nope", 1)
    with pytest.raises(InputError, match="non-negative number"):
        context_examples("key_value", -1)
    with pytest.raises(InputError, match="distractors must be an int from 1 to 8"):
        context_examples("key_value", 1, distractors=9)
    assert context_examples("key_value", 0) == []


@pytest.mark.parametrize("style", ["plain", "facts"])
@pytest.mark.parametrize("task", TASKS)
def test_encoding_puts_each_source_on_its_tokens(smollm2, task, style):
    _, tokenizer = smollm2
    example = context_examples(task, 1, seed=0, distractors=2)[0]
    text, spans, _ = prompt_text(example, tokenizer, style)
    assert [text[s:e].strip() for s, e in spans] == [source.strip() for source in example.sources]
    encoded = encode_context(example, tokenizer, style)
    assert encoded.text == text and len(encoded.ids) == len(encoded.source_of)
    for k in range(len(example.sources)):  # the tokens of source k spell it (a token that is only space is no
        pieces = tokenizer.decode([encoded.ids[p] for p, s in enumerate(encoded.source_of) if s == k])  # source's)
        assert "".join(pieces.split()) == "".join(example.sources[k].split())
    assert encoded.evidence == [p for p, s in enumerate(encoded.source_of) if s == example.evidence]
    copy = tokenizer.decode([encoded.ids[p] for p in encoded.answer_copy]).strip()
    assert copy == (example.answer.strip() if example.copy else "")
    assert set(encoded.answer_copy) <= set(encoded.evidence)
