"""Data for Clover models: the byte-level tokenizer and chat template, synthetic tasks
(``clover.data.tasks``) and the training / eval mixtures built from them."""

from clover.data.chat_template import CHAT_TEMPLATE
from clover.data.corpus import ChatText, eval_examples, format_chat, train_task_tokenizer, training_examples
from clover.data.tasks import EVAL_TASKS, TASKS, Example, Task, get_task
from clover.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, save_tokenizer, train_tokenizer

__all__ = [
    "CHAT_TEMPLATE", "EVAL_TASKS", "SPECIAL_TOKENS", "TASKS", "ChatText", "Example", "Task",
    "eval_examples", "format_chat", "get_task", "load_tokenizer", "save_tokenizer",
    "train_task_tokenizer", "train_tokenizer", "training_examples",
]
