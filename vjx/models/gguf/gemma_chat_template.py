"""Gemma's turn format as a chat template, for Gemma GGUFs that carry none.

    <bos><start_of_turn>user
    {system}

    {user}<end_of_turn>
    <start_of_turn>model
    {assistant}<end_of_turn>
    <start_of_turn>model          <- add_generation_prompt

Gemma has no system role: a leading system message goes in front of the first turn,
separated by a blank line, as Gemma 3's own template does. "assistant" is spelled "model";
turns must alternate user/model. Content is a string or a list of text parts (other parts
are dropped); turn contents are trimmed of surrounding whitespace, the system text is not.
"""

GEMMA_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(prefix='', turns=messages) -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.turns = messages[1:] -%}"
    "{%- set system = messages[0]['content'] -%}"
    "{%- if system is string -%}{%- set ns.prefix = system -%}"
    "{%- else -%}{%- for part in system if part['type'] == 'text' -%}"
    "{%- set ns.prefix = ns.prefix + part['text'] -%}{%- endfor -%}{%- endif -%}"
    "{%- set ns.prefix = ns.prefix + '\n\n' -%}"
    "{%- endif -%}"
    "{%- for message in ns.turns -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 is even) -%}"
    "{{- raise_exception('messages: roles must alternate user/assistant after an optional system message') -}}"
    "{%- endif -%}"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' -}}"
    "{%- if loop.first -%}{{- ns.prefix -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] if part['type'] == 'text' -%}"
    "{{- part['text'] | trim -}}{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)
