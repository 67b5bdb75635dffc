"""Writes the chat continuation cases of tests/oracle/make_chat_continue_golden.sh, one JSON
object a line: each template of TEMPLATES (text/tests/fixtures/templates: the llama.cpp sdist's
copies, see that folder's PROVENANCE.md; the folder given as the argument) with a final assistant message continued as content or as
reasoning, thinking on and off, and without continuation as the baseline."""
import json
import sys

TEMPLATES = [
    "qwen3.jinja",
    "qwen3.5.jinja",
    "qwen3-coder.jinja",
    "deepseek-v3.1.jinja",
    "deepseek-v3.2.jinja",
    "deepseek-v4.jinja",
    "deepseek-v4-flash-0731.jinja",
    "glm-4.6.jinja",
    "glm-4.7-flash.jinja",
    "solar-open-100b.jinja",
    "gemma-2.jinja",
]

# Each template's BOS and EOS texts, as text/tests/fixtures/template_goldens.json has them.
BOS_DS, EOS_DS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TOKENS = {
    "qwen3.jinja": ("", "<|im_end|>"),
    "qwen3.5.jinja": ("", "<|im_end|>"),
    "qwen3-coder.jinja": ("", "<|im_end|>"),
    "deepseek-v3.1.jinja": (BOS_DS, EOS_DS),
    "deepseek-v3.2.jinja": (BOS_DS, EOS_DS),
    "deepseek-v4.jinja": (BOS_DS, EOS_DS),
    "deepseek-v4-flash-0731.jinja": (BOS_DS, EOS_DS),
    "glm-4.6.jinja": ("", "<|endoftext|>"),
    "glm-4.7-flash.jinja": ("", "<|endoftext|>"),
    "solar-open-100b.jinja": ("<|startoftext|>", "<|endoftext|>"),
    "gemma-2.jinja": ("<bos>", "<eos>"),
}

BASE = [
    {"role": "system", "content": "Book"},
    {"role": "user", "content": "What is the best book"},
]

FINALS = [
    {"role": "assistant", "content": "Whill"},
    {"role": "assistant", "content": "Wh\n\nill"},
    {"role": "assistant", "content": "Sure: <b>\"Dune\"</b>, 沙丘"},
    {"role": "assistant", "content": "", "reasoning_content": "The user wants a book"},
    {"role": "assistant", "content": "Dune", "reasoning_content": "A classic"},
]


def cases(folder):
    for t in TEMPLATES:
        for thinking in (True, False):
            bos, eos = TOKENS[t]
            common = {"template": f"{folder}/{t}", "enable_thinking": thinking, "bos": bos, "eos": eos}
            yield {**common, "messages": BASE, "add_generation_prompt": True, "continue_final_message": None}
            for final in FINALS:
                for cont in (True, "content", "reasoning_content"):
                    yield {**common, "messages": BASE + [final], "add_generation_prompt": False,
                           "continue_final_message": cont}


if __name__ == "__main__":
    for c in cases(sys.argv[1]):
        print(json.dumps(c, ensure_ascii=False))
