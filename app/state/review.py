"""Review: the page's widget keys, and the whole-answer queue's state."""

from dataclasses import dataclass

KEY_NAME = "review.name"
KEY_START = "review.start"
KEY_CHANGE = "review.change_name"
KEY_DATASET = "review.dataset"
KEY_DETECTORS = "review.detectors"
KEY_SPAN_SOURCE = "review.span_source"
KEY_LIMIT = "review.limit"
KEY_SMOOTH = "review.smooth"
KEY_BUILD = "review.build"
KEY_F_DETECTORS = "review.f.detectors"
KEY_F_STATUS = "review.f.status"
KEY_F_TASK = "review.f.task"
KEY_F_GENERATOR = "review.f.generator"
KEY_SORT = "review.sort"
KEY_TABLE = "review.table"
KEY_ACCEPT = "review.accept"
KEY_REJECT = "review.reject"
KEY_NEXT = "review.next"
KEY_PREV = "review.prev"
KEY_EXPORT_WHO = "review.export.who"
KEY_EXPORT_ALL = "review.export.all"
KEY_EXPORT_NAME = "review.export.name"
KEY_EXPORT_SAVE = "review.export.save"
KEY_EXPORT_REPLACE = "review.export.replace"
KEY_REPORT = "review.report"
KEY_ADD_SPAN = "review.add_span"
KEY_REPORT_GET = "review.report.get"
KEY_MODE = "review.mode"
KEY_ORDER = "review.order"
KEY_FAITHFUL = "review.answer.faithful"
KEY_HALLUCINATED = "review.answer.hallucinated"
KEY_A_NEXT = "review.answer.next"
KEY_A_PREV = "review.answer.prev"
KEY_A_NOTE = "review.answer.note"
KEY_A_SKIP_MINE = "review.answer.skip_mine"
KEY_ADAPT_START = "review.adapt.start"
KEY_ADAPT_CANCEL = "review.adapt.cancel"
KEY_ADAPT_RESUME = "review.adapt.resume"
KEY_ADAPT_DISCARD = "review.adapt.discard"
KEY_ADAPT_REFIT = "review.adapt.refit"


@dataclass
class AnswerQueueState:
    """Where the reviewer is in the whole-answer queue."""

    current: str | None = None  # example id
    outcome: tuple[str, str] | None = None  # (kind, text), shown once
    order: str = "random"
