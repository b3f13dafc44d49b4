"""L-Eval (OpenLMLab/LEval; hub dataset L4NLP/LEval): one record = one document + questions.

Prompts are built as L-Eval's LongChat baseline builds them (`Baselines/longchat-test.py`
with `LEval_config.get_sys_prompt`; LongChat-13B-16K is one of the paper's models):
closed-ended tasks with its `exam_eval` format, open-ended tasks with its default format:

  exam:  HEADER + " USER: " + system + "Document is as follows. " + doc
         + " \\nQuestion: " + q + "  \\nAnswer:"
  open:  HEADER + " USER: " + system + "Document is as follows. " + doc
         + " \\nInstruction: " + q + " The suggested output length is around N words. "
         + " \\nASSISTANT: "
  gsm100, codeU:  system + doc + "\\n\\n" + q
  topic_retrieval_longchat:  HEADER + " USER: " + system + doc + "\\n\\n" + q + " \\nASSISTANT: "

(N = words in the reference answer, as the baseline computes it.) Too long a prompt has its
*document* cut, L-Eval's rule; generation is capped at its max_new_tokens = 512. Records with
the same document in one task (gsm100: 100 questions behind one 16-shot prefix) form one group.
"""

from __future__ import annotations

from pathlib import Path

from feather.workloads.hub import download, file_provenance
from feather.workloads.sources.base import (
    STRING,
    STRINGS,
    DataUnavailableError,
    GroupsByDocument,
    PromptGroup,
    SourceData,
    UnknownTaskError,
    find_task_file,
    read_jsonl,
)

CLOSED_ENDED = (
    "coursera",
    "quality",
    "topic_retrieval_longchat",
    "tpo",
    "gsm100",
    "codeU",
    "sci_fi",
)
OPEN_ENDED = (
    "financial_qa",
    "gov_report_summ",
    "legal_contract_qa",
    "meeting_summ",
    "multidoc_qa",
    "narrative_qa",
    "natural_question",
    "news_summ",
    "paper_assistant",
    "patent_summ",
    "review_summ",
    "scientific_qa",
    "tv_show_summ",
)
TASKS = CLOSED_ENDED + OPEN_ENDED
HUB_REPO = "L4NLP/LEval"
RECORD_FIELDS = {"input": STRING, "instructions": STRINGS, "outputs": STRINGS}
MAX_NEW_TOKENS = 512

HEADER = (
    "A chat between a curious user and an artificial intelligence assistant."
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
SYSTEM = {
    "gsm100": "Given several question answer pairs, you need to follow a similar format to answer "
    "the last question. Make sure the response is end with The answer is _ . ",
    "topic_retrieval_longchat": "Below is a record of our previous conversation on many different "
    "topics. You are the ASSISTANT, and I am the USER. At the beginning of each topic, the USER "
    "will say 'I would like to discuss the topic of <TOPIC>'. Memorize each <TOPIC>. At the end of "
    "the record, I will ask you to retrieve the first/second/third topic names. Now the record "
    "start. ",
    "coursera": "Now you are given a very long document. Please follow the instruction based on "
    "this document. For multi-choice questions, there could be a sinlge correct option or multiple "
    "correct options. Please only provide the letter corresponding to the answer (like A or AB) "
    "when answering. ",
    "codeU": "Now you are given a code base consisting of a large amount of functions and the "
    "corresponding comments. In the end, I will call some functions defined in the code base. "
    "Please carefully read these codes and comments and answer the question.",
    "sci_fi": "Now you are given a scientific fiction. I will ask you some questions and the "
    'answer should be "True" or "False". Notice that you should answer the question based on the '
    "evidence in the document instead of your background knowledge.",
}
SYSTEM_EXAM = (
    "Now you are given a very long document. Please follow the instruction based on this "
    "document. For multi-choice questions, there is only a sinlge correct option. Please only "
    "provide the letter corresponding to the answer (like A or B) when answering. For other "
    "questions, please directly give the concise and accurate answer. "
)
SYSTEM_OPEN = (
    "Now you are given a very long document. Please follow the instruction after this document. "
    "These instructions may include summarizing a document, answering questions based on the "
    "document, or writing a required paragraph. "
)


def _segments(task: str, question: str, reference: str) -> tuple[str, str]:
    """(head, tail) of one request of `task`, around the document."""
    if task in ("gsm100", "codeU"):
        return SYSTEM[task], "\n\n" + question
    if task == "topic_retrieval_longchat":
        return HEADER + " USER: " + SYSTEM[task], "\n\n" + question + " \nASSISTANT: "
    head_doc = "Document is as follows. "
    if task in CLOSED_ENDED:
        system = SYSTEM.get(task, SYSTEM_EXAM)
        return HEADER + " USER: " + system + head_doc, " \nQuestion: " + question + "  \nAnswer:"
    words = len(reference.split())
    return (
        HEADER + " USER: " + SYSTEM_OPEN + head_doc,
        " \nInstruction: " + question + f" The suggested output length is around {words} words. "
        " \nASSISTANT: ",
    )


def _task_files(tasks: list[str], data_dir: Path | None, raw_dir: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for task in tasks:
        if data_dir is not None:
            found = find_task_file(data_dir, task)
            if found is None:
                raise DataUnavailableError(
                    f"L-Eval task {task!r}: no {task}.jsonl below {data_dir}"
                )
            files[task] = found
        else:
            folder = "Exam" if task in CLOSED_ENDED else "Generation"
            files[task] = download(
                HUB_REPO, f"LEval/{folder}/{task}.jsonl", raw_dir / "leval", what=f"L-Eval {task}"
            )
    return files


def load_leval(tasks: list[str] | None, data_dir: Path | None, raw_dir: Path) -> SourceData:
    """Prompt groups of the chosen L-Eval tasks (default: every task the data holds)."""
    if tasks:
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise UnknownTaskError(
                f"unknown L-Eval task(s) {', '.join(unknown)}; tasks: {', '.join(TASKS)}"
            )
        chosen = list(tasks)
    elif data_dir is not None:
        chosen = [t for t in TASKS if find_task_file(data_dir, t) is not None]
        if not chosen:
            raise DataUnavailableError(f"no L-Eval task files (<task>.jsonl) below {data_dir}")
    else:
        chosen = list(TASKS)
    files = _task_files(chosen, data_dir, raw_dir)
    data = SourceData(groups=[], files=[file_provenance(files[t]) for t in chosen])
    data.dropped = {"empty_documents": 0, "empty_questions": 0, "unpaired_questions": 0}
    data.dropped["tasks_not_in_data"] = len(TASKS) - len(chosen) if not tasks else 0
    for task in chosen:
        by_document = GroupsByDocument()
        records = read_jsonl(files[task], f"L-Eval {task}", RECORD_FIELDS)
        for record in records:
            document = record.get("input") or ""
            if not document.strip():
                data.dropped["empty_documents"] += 1
                continue
            questions = record.get("instructions") or []
            answers = record.get("outputs") or []
            data.dropped["unpaired_questions"] += abs(len(questions) - len(answers))
            for question, answer in zip(questions, answers, strict=False):
                if not question or not question.strip():
                    data.dropped["empty_questions"] += 1
                    continue
                head, tail = _segments(task, question, answer or "")
                by_document.add(
                    document,
                    tail,
                    answer or "",
                    lambda key, task=task, head=head, document=document: PromptGroup(
                        source="leval",
                        task=task,
                        doc_key=key,
                        head=head,
                        document=document,
                        tails=[],
                        references=[],
                        truncation="document",
                        max_output_tokens=MAX_NEW_TOKENS,
                    ),
                )
        data.groups.extend(by_document.groups())
    return data
