"""The chat template of the Qwen paper scripts, for the models built here: ChatML with the answer opened by
``<think>``. The same text as ``run_scripts/chat_templates/qwen_think.jinja`` (tested), kept in the package so an
installed copy without the scripts has it too."""

CHATML_THINK_TEMPLATE = (
    '{%- for message in messages %}{{- "<|im_start|>" + message["role"] + "\\n" + message["content"] + "<|im_end|>\\n" }}'
    '{%- endfor %}{%- if add_generation_prompt %}{{- "<|im_start|>assistant\\n<think>\\n" }}{%- endif %}'
)
