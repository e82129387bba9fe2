"""Ground-truth context tasks: the answer is stated in one known place of a context among distractors.

Each generator is seeded and needs no files: ``context_examples("who_lives_where", 100, seed=0, distractors=3)``
gives the same 100 examples on every machine. An example's context is a list of *sources* (one fact each, in
random order); exactly one of them, the *evidence*, states what the question asks; the others are distractors
of the same form. A method that explains the model's answer should put its mass on the evidence: the tasks
give context attribution a ground truth (pointing accuracy, mass on the evidence) on examples the model answers
correctly. The answer is scored among ``candidates`` (every answer a source of the example would give), so
chance is ``1 / len(candidates)``.

Two kinds of tasks: in *copy* tasks the answer's words stand in the evidence (a score that projects on the
answer's unembedding finds them by construction, where embeddings are tied); in the others the evidence
implies the answer without containing it (a yes/no question about a fact, a country implied by a city, a job
described without its name), so a method has to find the fact, not the string.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from captum_cw.errors import InputError

__all__ = ["CONTEXT_TASKS", "PROMPT_STYLES", "ContextExample", "ContextTask", "EncodedContext", "context_examples",
           "encode_context", "prompt_text", "token_sources"]

PROMPT_STYLES = ("plain", "facts", "chat")
r"""How a context example becomes a prompt: ``"plain"`` (the sources, then the question), ``"facts"`` (``Facts:``,
one source a line, a blank line, the question) or ``"chat"`` (the sources as the user's message through the
tokenizer's chat template, the question as the start of the assistant's answer)."""

# single words that are one token, with their leading space, in the bundled models' tokenizers
NAMES = ("Anna", "Tom", "Maria", "John", "Paul", "Sarah", "David", "Emma", "Peter", "Lucy", "Mark", "Alice",
         "James", "Laura", "Kevin", "Nina")
CITIES = {"Paris": "France", "Rome": "Italy", "London": "England", "Berlin": "Germany", "Madrid": "Spain",
          "Tokyo": "Japan", "Cairo": "Egypt", "Moscow": "Russia", "Dublin": "Ireland", "Athens": "Greece",
          "Lisbon": "Portugal", "Beijing": "China", "Delhi": "India", "Toronto": "Canada"}
OBJECTS = ("apple", "chair", "river", "table", "lamp", "horse", "cloud", "stone", "bottle", "garden", "window",
           "pencil", "mirror", "candle", "bridge", "basket")
LETTERS = "ABCDEFGHI"
r"""The option letters of :func:`_where_choice` (one per source, up to 9)."""
COLOURS = ("red", "blue", "green", "yellow", "black", "white", "brown", "pink", "orange", "purple")
ADJECTIVES = ("old", "new", "big", "small", "dark", "bright")
JOBS = {"teacher": "gives lessons to children at a school", "doctor": "treats sick people in a hospital",
        "pilot": "flies planes for an airline", "farmer": "grows vegetables and keeps cows",
        "baker": "makes bread and cakes in a shop", "singer": "performs songs on stage",
        "driver": "takes people around town in a taxi", "writer": "has published many novels",
        "dentist": "looks after people's teeth", "lawyer": "defends people in court",
        "mechanic": "repairs cars in a garage", "nurse": "cares for patients on a hospital ward"}
r"""Each job and a description of it that never names it (no four-letter stem of the job in it)."""
VERDICTS = {"The food was": ("delicious", "awful"),
            "The staff were": ("friendly and helpful", "rude and unhelpful"),
            "The room was": ("clean and comfortable", "dirty and uncomfortable"),
            "The film was": ("wonderful", "terrible"),
            "The soup was": ("excellent", "disgusting"), "The concert was": ("amazing", "dreadful"),
            "The view was": ("beautiful", "ugly"), "The book was": ("a delight to read", "a chore to read"),
            "The service was": ("fantastic", "horrible"), "The cake was": ("lovely", "stale")}
r"""Each subject of :func:`_review_sentiment`'s evidence and its praise and its complaint (neither names the label)."""
NEUTRAL = ("We arrived at seven.", "The restaurant is near the station.", "Tom ordered the soup.", "It was a Tuesday.",
           "We went there by bus.", "The building has three floors.", "My sister came with me.", "We paid by card.",
           "The menu is printed in two languages.", "We left at nine.", "The tables are made of wood.",
           "Parking is behind the building.", "We booked a week ahead.", "The kitchen is open until ten.",
           "There were four of us.", "The windows face the street.")
r"""Sentences that state facts and no judgement: :func:`_review_sentiment`'s distractors."""


@dataclass(frozen=True)
class ContextExample:
    r"""
    One ground-truth context example.

    Attributes:
        id (str): ``"{task}-{index}"``.
        task (str): the generator's name.
        sources (tuple[str, ...]): the context, one fact per source; the context is their concatenation.
        question (str): what follows the context; the model answers after it.
        answer (str): the expected continuation, with its leading space (``" Paris"``).
        candidates (tuple[str, ...]): the answer and every other answer a source could give (chance is one over
                    their number), each with its leading space.
        evidence (int): the index of the source that states what the question asks.
        copy (bool): whether the answer's words stand in the evidence (a copy task).
    """

    id: str
    task: str
    sources: tuple[str, ...]
    question: str
    answer: str
    candidates: tuple[str, ...]
    evidence: int
    copy: bool

    @property
    def context(self) -> str:
        return "".join(self.sources)

    @property
    def prompt(self) -> str:
        return self.context + self.question

    def source_spans(self) -> list[tuple[int, int]]:
        r"""The character span ``[start, end)`` of each source in :attr:`prompt`."""
        spans, start = [], 0
        for source in self.sources:
            spans.append((start, start + len(source)))
            start += len(source)
        return spans

    def answer_spans(self) -> list[tuple[int, int]]:
        r"""Where the answer's word stands in the context (character spans in :attr:`prompt`): the in-context copy
        of the answer that a copy task's evidence holds (empty for the other tasks, where a letter or a ``no``
        found inside another word is no copy)."""
        if not self.copy:
            return []
        word, context, spans, start = self.answer.strip(), self.context, [], 0
        while (found := context.find(word, start)) >= 0:
            spans.append((found, found + len(word)))
            start = found + len(word)
        return spans


@dataclass(frozen=True)
class ContextTask:
    r"""A generator of ground-truth examples: ``make(rng, distractors)`` returns ``(sources, question, answer,
    candidates, evidence)``; ``copy`` says whether the answer's words stand in the evidence, ``per_source`` whether
    candidate ``k`` is the answer source ``k`` would give (not so for yes/no)."""

    name: str
    description: str
    copy: bool
    make: Callable[[random.Random, int], tuple[list[str], str, str, list[str], int]]
    per_source: bool = True


def _who_lives_where(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    names = rng.sample(NAMES, distractors + 1)
    cities = rng.sample(list(CITIES), distractors + 1)
    sources = [f"{name} lives in {city}. " for name, city in zip(names, cities)]
    asked = rng.randrange(len(names))
    return sources, f"{names[asked]} lives in", f" {cities[asked]}", [f" {c}" for c in cities], asked


def _key_value(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    objects = rng.sample(OBJECTS, distractors + 1)
    colours = rng.sample(COLOURS, distractors + 1)
    sources = [f"The {thing} is {colour}. " for thing, colour in zip(objects, colours)]
    asked = rng.randrange(len(objects))
    return sources, f"The {objects[asked]} is", f" {colours[asked]}", [f" {c}" for c in colours], asked


def _induction(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""Two-word keys that share words with the distractors (only both words tell the asked key apart), each
    followed by a number: ``"old apple: 7\n"``; the question repeats one key."""
    adjectives = rng.sample(ADJECTIVES, 2)
    nouns = rng.sample(OBJECTS, (distractors + 2) // 2)
    keys = [(a, n) for n in nouns for a in adjectives][: distractors + 1]
    rng.shuffle(keys)
    numbers = rng.sample(range(1, 10), distractors + 1)
    sources = [f"{a} {n}: {k}\n" for (a, n), k in zip(keys, numbers)]
    asked = rng.randrange(len(keys))
    a, n = keys[asked]
    return sources, f"{a} {n}:", f" {numbers[asked]}", [f" {k}" for k in numbers], asked


def _where_question(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""The fact stated in a passage, then asked in another form."""
    sources, _, answer, candidates, asked = _who_lives_where(rng, distractors)
    name = sources[asked].split(" lives in ")[0]
    return sources, f"\nQuestion: Where does {name} live?\nAnswer:", answer, candidates, asked


def _country_of_city(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""The evidence names a city; the answer is its country, which the context never states."""
    names = rng.sample(NAMES, distractors + 1)
    cities = rng.sample(list(CITIES), distractors + 1)
    sources = [f"{name} lives in {city}. " for name, city in zip(names, cities)]
    asked = rng.randrange(len(names))
    return (sources, f"{names[asked]} lives in the country of", f" {CITIES[cities[asked]]}",
            [f" {CITIES[c]}" for c in cities], asked)


def _job_of_description(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""A paraphrase: the evidence describes the answer without naming it (``"Tom repairs cars in a garage."``,
    then ``"Tom works as a"`` -> ``" mechanic"``)."""
    names = rng.sample(NAMES, distractors + 1)
    jobs = rng.sample(list(JOBS), distractors + 1)
    sources = [f"{name} {JOBS[job]}. " for name, job in zip(names, jobs)]
    asked = rng.randrange(len(names))
    return sources, f"{names[asked]} works as a", f" {jobs[asked]}", [f" {job}" for job in jobs], asked


def _yes_no(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""A yes/no question about one fact: the evidence is the fact about the asked person, true or not."""
    names = rng.sample(NAMES, distractors + 1)
    cities = rng.sample(list(CITIES), distractors + 2)
    sources = [f"{name} lives in {city}. " for name, city in zip(names, cities)]
    asked = rng.randrange(len(names))
    truth = rng.random() < 0.5
    city = cities[asked] if truth else cities[-1]  # the last city is nobody's
    return (sources, f"\nQuestion: Does {names[asked]} live in {city}?\nAnswer:", " yes" if truth else " no",
            [" yes", " no"], asked)


def _where_choice(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""A multiple-choice question about one fact: every source's city as a lettered option, in a random order; the
    answer is the evidence's city's letter, which the evidence supports without stating it."""
    sources, _, answer, candidates, asked = _who_lives_where(rng, distractors)
    name = sources[asked].split(" lives in ")[0]
    order = rng.sample(range(len(sources)), len(sources))  # order[k]: the source whose city is option k
    options = "".join(f"\n{letter}. {candidates[source].strip()}" for letter, source in zip(LETTERS, order))
    return (sources, f"\nQuestion: Where does {name} live?{options}\nAnswer:", f" {LETTERS[order.index(asked)]}",
            [f" {letter}" for letter in LETTERS[:len(sources)]], asked)


def _country_choice(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""A multiple-choice question whose options are words: every source's country, in a random order, stands in
    the question; the evidence names the asked person's city, which implies the answer without stating it
    (``"Tom lives in Lyon."``, then ``"Which country does Tom live in: Spain, France or Italy?"`` -> ``" France"``)."""
    sources, _, answer, candidates, asked = _country_of_city(rng, distractors)
    name = sources[asked].split(" lives in ")[0]
    options = [candidates[source].strip() for source in rng.sample(range(len(sources)), len(sources))]
    listed = ", ".join(options[:-1]) + f" or {options[-1]}"
    return sources, f"\nQuestion: Which country does {name} live in: {listed}?\nAnswer:", answer, candidates, asked


def _review_sentiment(rng: random.Random, distractors: int) -> tuple[list[str], str, str, list[str], int]:
    r"""A supporting sentence for a two-way answer: one sentence of the review judges something, the others state
    facts; the answer is the label its judgement implies (``"The soup was disgusting."`` -> ``" negative"``), which
    no source names."""
    subject = rng.choice(list(VERDICTS))
    praised = rng.random() < 0.5
    sources = [f"{sentence} " for sentence in rng.sample(NEUTRAL, distractors)]
    evidence = rng.randrange(distractors + 1)
    sources.insert(evidence, f"{subject} {VERDICTS[subject][0 if praised else 1]}. ")
    answer = " positive" if praised else " negative"
    return sources, "\nIn one word, the review is", answer, [" positive", " negative"], evidence

CONTEXT_TASKS: dict[str, ContextTask] = {task.name: task for task in (
    ContextTask("who_lives_where", "'Anna lives in Paris. Tom lives in Rome. ...' then 'Tom lives in'", True,
                _who_lives_where),
    ContextTask("key_value", "'The apple is red. The chair is blue. ...' then 'The chair is'", True, _key_value),
    ContextTask("induction", "lines 'old apple: 7' with two-word keys sharing words, then one key repeated", True,
                _induction),
    ContextTask("where_question", "who lives where, then 'Question: Where does Tom live?\\nAnswer:'", True,
                _where_question),
    ContextTask("country_of_city", "who lives where, then 'Tom lives in the country of' (the country is never "
                "stated)", False, _country_of_city),
    ContextTask("job_of_description", "'Tom repairs cars in a garage. ...' then 'Tom works as a' (a paraphrase: "
                "the job is never named)", False, _job_of_description),
    ContextTask("yes_no", "who lives where, then 'Question: Does Tom live in Rome?\\nAnswer:' (yes or no)", False,
                _yes_no, per_source=False),
    ContextTask("where_choice", "who lives where, then 'Question: Where does Tom live?\\nA. Rome\\nB. Paris\\nAnswer:' "
                "(a letter)", False, _where_choice, per_source=False),
    ContextTask("country_choice", "who lives where, then 'Question: Which country does Tom live in: Spain, Italy "
                "or France?\\nAnswer:' (the options are words; the evidence names the city)", False, _country_choice),
    ContextTask("review_sentiment", "'We arrived at seven. The soup was disgusting. ...' then 'In one word, the review "
                "is' (positive or negative: the one judging sentence implies the label, which no source names)", False,
                _review_sentiment, per_source=False),
)}


def context_examples(task: str, n: int, seed: int = 0, distractors: int = 3) -> list[ContextExample]:
    r"""
    ``n`` examples of a ground-truth context task, the same for the same arguments on every machine.

    Args:
        task (str): one of :data:`CONTEXT_TASKS`.
        n (int): how many examples.
        seed (int, optional): the generator's seed. Default: 0
        distractors (int, optional): sources besides the evidence. Default: 3
    Returns:
        list of :class:`ContextExample`.
    """
    if task not in CONTEXT_TASKS:
        raise InputError(f"Unknown context task {task!r}; choose one of {', '.join(CONTEXT_TASKS)}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"n must be a non-negative number of examples, got {n!r}.")
    if isinstance(distractors, bool) or not isinstance(distractors, int) or not 1 <= distractors <= 8:
        raise InputError(f"distractors must be an int from 1 to 8 (sources besides the evidence), got "
                         f"{distractors!r}.")
    spec = CONTEXT_TASKS[task]
    rng = random.Random(f"{task}:{seed}:{distractors}")
    examples = []
    for index in range(n):
        sources, question, answer, candidates, evidence = spec.make(rng, distractors)
        examples.append(ContextExample(f"{task}-{index}", task, tuple(sources), question, answer,
                                       tuple(dict.fromkeys(candidates)), evidence, spec.copy))
    return examples


@dataclass(frozen=True)
class EncodedContext:
    r"""
    A context example as token ids, with where its parts are.

    Attributes:
        ids (list[int]): the prompt's token ids (special tokens included).
        source_of (list[int]): for each token, the index of the source it belongs to, -1 outside the context.
        evidence (list[int]): the positions of the evidence source's tokens.
        answer_copy (list[int]): the positions of the tokens of the answer's in-context copy (empty if none).
        text (str): the prompt as text.
    """

    ids: list[int]
    source_of: list[int]
    evidence: list[int]
    answer_copy: list[int]
    text: str

    @property
    def context(self) -> list[int]:
        r"""The positions of the context's tokens."""
        return [position for position, source in enumerate(self.source_of) if source >= 0]


def prompt_text(example: ContextExample, tokenizer: Any, style: str) -> tuple[str, list[tuple[int, int]], bool]:
    r"""
    The prompt of an example in a style (:data:`PROMPT_STYLES`).

    Returns:
        ``(text, spans, templated)``: the text, each source's character span ``[start, end)`` in it, and whether
        the text already holds the special tokens (a chat template), so that it is tokenized without adding them.
    """
    if style == "plain":
        return example.prompt, example.source_spans(), False
    if style == "facts":
        lines = [source.strip() + "\n" for source in example.sources]
        spans, start = [], len("Facts:\n")
        for line in lines:
            spans.append((start, start + len(line) - 1))
            start += len(line)
        return "Facts:\n" + "".join(lines) + "\n" + example.question.strip(), spans, False
    if style != "chat":
        raise InputError(f"Unknown prompt style {style!r}; choose one of {', '.join(PROMPT_STYLES)}.")
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"{type(tokenizer).__name__} has no chat template; use style='facts' or 'plain'.")
    context = example.context.strip()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": context}], add_generation_prompt=True,
                                             tokenize=False)
    offset = rendered.index(context)
    return rendered + example.question.strip(), [(start + offset, end + offset) for start, end in
                                                 example.source_spans()], True


def encode_context(example: ContextExample, tokenizer: Any, style: str = "plain") -> EncodedContext:
    r"""
    Tokenizes a context example in a prompt style (:data:`PROMPT_STYLES`) and finds its sources' tokens.

    Args:
        example (ContextExample): the example.
        tokenizer: a fast transformers tokenizer (for its offsets).
        style (str, optional): ``"plain"``, ``"facts"`` or ``"chat"``. Default: ``"plain"``
    Returns:
        :class:`EncodedContext`; a token belongs to a source when its characters lie within the source's span
        (leading and trailing whitespace of a token ignored).
    """
    text, spans, templated = prompt_text(example, tokenizer, style)
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=not templated)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    source_of = token_sources(text, offsets, spans)
    word = example.answer.strip()
    copies = [(spans[example.evidence][0] + found, spans[example.evidence][0] + found + len(word))
              for found in _find_all(text[slice(*spans[example.evidence])], word)]
    answer_copy = [position for position, (start, end) in enumerate(offsets)
                   if end > start and any(s < end and start < e for s, e in copies)]
    evidence = [position for position, source in enumerate(source_of) if source == example.evidence]
    return EncodedContext(ids, source_of, evidence, answer_copy, text)


def token_sources(text: str, offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    r"""For each token (its character offsets in ``text``), the index of the span that holds its characters
    (whitespace around them ignored), or -1: which source each token belongs to."""
    found = []
    for start, end in offsets:
        piece = text[start:end]
        start, end = start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip())
        found.append(next((k for k, (s, e) in enumerate(spans) if end > start and s <= start and end <= e), -1))
    return found


def _find_all(text: str, word: str) -> list[int]:
    found, start = [], 0
    while word and (index := text.find(word, start)) >= 0:
        found.append(index)
        start = index + len(word)
    return found
