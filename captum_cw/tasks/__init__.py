"""Task data: the task registry (prompts, answer choices, where the rows come from) and the schema every row is
checked against. The evaluation and the sink study read their examples here; nothing here knows about them."""

from captum_cw.tasks.registry import KINDS, SAMPLES, SOURCES, TASKS, Example, Kind, Sample, Task, load_examples
from captum_cw.tasks.schemas import SCHEMAS, Rule, SourceRow, check_row, read_jsonl

__all__ = [
    "KINDS",
    "SAMPLES",
    "SCHEMAS",
    "SOURCES",
    "TASKS",
    "Example",
    "Kind",
    "Rule",
    "Sample",
    "SourceRow",
    "Task",
    "check_row",
    "load_examples",
    "read_jsonl",
]
