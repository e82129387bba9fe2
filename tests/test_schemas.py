"""Every row is checked against its task's schema, and a bad one is named by file and line."""

import json

import pytest

from captum_cw.errors import InputError
from captum_cw.evaluation import load_examples
from captum_cw.tasks import TASKS, check_row, read_jsonl

GOOD = {
    "mmlu": {"question": "2 + 2?", "subject": "math", "choices": ["1", "2", "3", "4"], "answer": 3},
    "winogrande": {"sentence": "Ann helped Bo because _ was kind.", "option1": "Ann", "option2": "Bo", "answer": "1"},
    "boolq": {"question": "is the sky blue", "passage": "The sky is blue.", "answer": True},
    "gsm8k": {"question": "1 + 1?", "answer": "2\n#### 2"},
    "fineweb_edu": {"text": "Some text."},
}


def _write(folder, task, rows):
    path = folder / TASKS[task].local_file
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("task", list(GOOD))
def test_good_rows_build_the_same_examples_as_before(tmp_path, task):
    _write(tmp_path, task, [GOOD[task], GOOD[task]])
    examples = load_examples(task, data_dir=tmp_path)
    assert [example.id for example in examples] == [f"{task}-0", f"{task}-1"]
    assert examples[0] == TASKS[task].build(0, GOOD[task])


@pytest.mark.parametrize("task, change, message", [
    ("boolq", {"answer": "false"}, "boolq field 'answer' must be true or false (a JSON boolean, not a string), "
                                   "got \"false\""),
    ("boolq", {"passage": None}, "boolq field 'passage' must be a string, got null"),
    ("boolq", {"passage": ...}, "the row has no field 'passage'; a boolq row needs 'question', 'passage', 'answer'"),
    ("mmlu", {"answer": 7}, "mmlu field 'answer' must be an integer from 0 to 3 (the index of the right choice), "
                            "got 7"),
    ("mmlu", {"answer": True}, "mmlu field 'answer' must be an integer from 0 to 3"),
    ("mmlu", {"choices": ["a", "b", "c"]}, 'mmlu field \'choices\' must be a list of 4 strings, got ["a", "b", "c"]'),
    ("winogrande", {"sentence": "no blank here"}, "winogrande field 'sentence' must be a string with exactly one "
                                                  "blank '_'"),
    ("winogrande", {"answer": "3"}, "winogrande field 'answer' must be \"1\" or \"2\""),
    ("gsm8k", {"answer": 2}, "gsm8k field 'answer' must be a string, got 2"),
    ("fineweb_edu", {"text": ["a"]}, "fineweb_edu field 'text' must be a string"),
])
def test_a_bad_row_is_named_by_file_and_line(tmp_path, task, change, message):
    bad = {key: value for key, value in {**GOOD[task], **change}.items() if value is not ...}
    path = _write(tmp_path, task, [GOOD[task], "", bad])
    with pytest.raises(ValueError) as error:
        load_examples(task, data_dir=tmp_path)
    assert str(error.value).startswith(f"{path}:3: {message}")


def test_only_the_rows_used_are_checked(tmp_path):
    _write(tmp_path, "boolq", [GOOD["boolq"], {**GOOD["boolq"], "answer": "yes"}])
    assert len(load_examples("boolq", 1, data_dir=tmp_path)) == 1


def test_rows_from_elsewhere_are_named_by_index():
    with pytest.raises(ValueError, match=r"^boolq row 4: boolq field 'answer' must be true or false"):
        check_row("boolq", {**GOOD["boolq"], "answer": 1}, 4)
    assert check_row("winogrande", {**GOOD["winogrande"], "answer": 2}, 0)["answer"] == 2  # ints 1 and 2 as well


def test_malformed_files_are_named_by_file_and_line(tmp_path):
    path = _write(tmp_path, "fineweb_edu", [GOOD["fineweb_edu"], '{"text": "unfinished'])
    with pytest.raises(ValueError, match=rf"^{path}:2: not valid JSON \(.*\); each line must hold one JSON object"):
        load_examples("fineweb_edu", data_dir=tmp_path)
    path = _write(tmp_path, "gsm8k", ['["question", "answer"]'])
    with pytest.raises(ValueError, match=rf"^{path}:1: a JSON list where a row object"):
        load_examples("gsm8k", data_dir=tmp_path)
    path.write_bytes(b'{"question": "\xff", "answer": "1"}\n')
    with pytest.raises(InputError, match=rf"^{path}:1: field 'question' is not valid UTF-8 text \(byte 0xff"):
        load_examples("gsm8k", data_dir=tmp_path)
    for content in ("", "\n\n"):
        path.write_text(content)
        with pytest.raises(ValueError, match=rf"^{path} holds no rows"):
            load_examples("gsm8k", data_dir=tmp_path)


def test_reader_keeps_each_rows_line(tmp_path):
    path = _write(tmp_path, "gsm8k", [GOOD["gsm8k"], "", GOOD["gsm8k"]])
    assert [row.location for row in read_jsonl(path)] == [f"{path}:1", f"{path}:3"]


@pytest.mark.parametrize("task, field", [("fineweb_edu", "text"), ("mmlu", "choices"), ("winogrande", "option2")])
def test_a_lone_surrogate_is_named_by_file_line_and_field_before_any_tokenizer(tmp_path, task, field):
    # json.loads reads the escape "\\udc80" as a lone surrogate: no character, no UTF-8 encoding, and a
    # TypeError from the tokenizer much later
    bad = dict(GOOD[task])
    bad[field] = [*bad[field][:3], "x\udc80"] if isinstance(bad[field], list) else "x \udc80 y"
    line = json.dumps(bad)  # ASCII: the surrogate is written as its escape
    assert "\\udc80" in line
    path = _write(tmp_path, task, [json.dumps(GOOD[task]), line])
    with pytest.raises(InputError, match=rf"^{path}:2: {task} field '{field}' is not valid UTF-8 text"):
        load_examples(task, data_dir=tmp_path)
