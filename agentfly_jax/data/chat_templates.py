"""Chat templates (jinja strings) for the tiny test tokenizers.

Written for this project, modelled on the templates Qwen2.5-Instruct and Llama-3.x-Instruct ship
in their `tokenizer_config.json`: the same turn markers, tools listed in the system prompt (Qwen)
or the first user turn (Llama), assistant tool calls rendered as JSON, tool results in their own
turn. They are rendered by HF `apply_chat_template` and by `agentfly_jax.agents.chat_template`
byte-identically (same jinja environment: trim_blocks, lstrip_blocks, `tojson`,
`raise_exception`, `strftime_now`).

Both are prefix-stable: rendering a conversation and then the same conversation with more
messages appended (and `add_generation_prompt=True`) extends the first text; the rollout relies
on that to tokenize only the new, non-model text.
"""

QWEN25_DEFAULT_SYSTEM = "You are a helpful assistant."

# Qwen2.5 style: <|im_start|>role\n ... <|im_end|>\n; tools as JSON lines inside <tools></tools>;
# assistant tool calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>; consecutive tool
# results grouped in one user turn, each inside <tool_response></tool_response>.
QWEN25_CHAT_TEMPLATE = (
  "{%- set default_system = '" + QWEN25_DEFAULT_SYSTEM + "' %}\n"
  "{%- if messages and messages[0]['role'] == 'system' %}\n"
  "  {%- set system_text = messages[0]['content'] %}\n"
  "  {%- set loop_messages = messages[1:] %}\n"
  "{%- else %}\n"
  "  {%- set system_text = default_system %}\n"
  "  {%- set loop_messages = messages %}\n"
  "{%- endif %}\n"
  "{{- '<|im_start|>system\\n' + system_text }}\n"
  "{%- if tools %}\n"
  "  {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'"
  " + '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}\n"
  "  {%- for tool in tools %}\n"
  "    {{- '\\n' + (tool | tojson) }}\n"
  "  {%- endfor %}\n"
  "  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and'"
  " + ' arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
  " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' }}\n"
  "{%- endif %}\n"
  "{{- '<|im_end|>\\n' }}\n"
  "{%- for message in loop_messages %}\n"
  "  {%- if message['role'] == 'tool' %}\n"
  "    {%- if loop.first or loop_messages[loop.index0 - 1]['role'] != 'tool' %}\n"
  "      {{- '<|im_start|>user' }}\n"
  "    {%- endif %}\n"
  "    {{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}\n"
  "    {%- if loop.last or loop_messages[loop.index0 + 1]['role'] != 'tool' %}\n"
  "      {{- '<|im_end|>\\n' }}\n"
  "    {%- endif %}\n"
  "  {%- elif message['role'] == 'assistant' and message.get('tool_calls') %}\n"
  "    {{- '<|im_start|>assistant' }}\n"
  "    {%- if message['content'] %}\n"
  "      {{- '\\n' + message['content'] }}\n"
  "    {%- endif %}\n"
  "    {%- for call in message['tool_calls'] %}\n"
  "      {%- if call['function'] is defined %}\n"
  "        {%- set call = call['function'] %}\n"
  "      {%- endif %}\n"
  "      {%- if call['arguments'] is string %}\n"
  "        {%- set arguments_json = call['arguments'] %}\n"
  "      {%- else %}\n"
  "        {%- set arguments_json = call['arguments'] | tojson %}\n"
  "      {%- endif %}\n"
  "      {{- '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": '"
  " + arguments_json + '}\\n</tool_call>' }}\n"
  "    {%- endfor %}\n"
  "    {{- '<|im_end|>\\n' }}\n"
  "  {%- elif message['role'] in ['user', 'assistant', 'system'] %}\n"
  "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
  "  {%- else %}\n"
  "    {{- raise_exception('Unknown message role: ' + message['role']) }}\n"
  "  {%- endif %}\n"
  "{%- endfor %}\n"
  "{%- if add_generation_prompt %}\n"
  "  {{- '<|im_start|>assistant\\n' }}\n"
  "{%- endif %}\n"
)

LLAMA3_DEFAULT_DATE = "26 Jul 2024"

# Llama 3.x style: <|begin_of_text|>, <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>;
# a system turn with "Cutting Knowledge Date" and today's date (`date_string`, else
# `strftime_now`); tools as indented JSON in the first user turn; assistant tool calls as
# {"name": ..., "parameters": ...} (one per line); tool results in an `ipython` turn.
LLAMA3_CHAT_TEMPLATE = (
  "{{- bos_token }}\n"
  "{%- if date_string is not defined %}\n"
  "  {%- if strftime_now is defined %}\n"
  "    {%- set date_string = strftime_now('%d %b %Y') %}\n"
  "  {%- else %}\n"
  "    {%- set date_string = '" + LLAMA3_DEFAULT_DATE + "' %}\n"
  "  {%- endif %}\n"
  "{%- endif %}\n"
  "{%- if messages and messages[0]['role'] == 'system' %}\n"
  "  {%- set system_text = messages[0]['content'] | trim %}\n"
  "  {%- set loop_messages = messages[1:] %}\n"
  "{%- else %}\n"
  "  {%- set system_text = '' %}\n"
  "  {%- set loop_messages = messages %}\n"
  "{%- endif %}\n"
  "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
  "{%- if tools %}\n"
  "  {{- 'Environment: ipython\\n' }}\n"
  "{%- endif %}\n"
  "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}\n"
  "{{- system_text + '<|eot_id|>' }}\n"
  "{%- if tools %}\n"
  "  {%- if not loop_messages or loop_messages[0]['role'] != 'user' %}\n"
  "    {{- raise_exception('With tools, the first message after the system prompt must be a user message.') }}\n"
  "  {%- endif %}\n"
  "  {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}\n"
  "  {{- 'Given the following functions, please respond with a JSON for a function call with its'"
  " + ' proper arguments that best answers the given prompt.\\n\\n' }}\n"
  "  {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument'"
  " + ' name and its value}. Do not use variables.\\n\\n' }}\n"
  "  {%- for tool in tools %}\n"
  "    {{- (tool | tojson(indent=4)) + '\\n\\n' }}\n"
  "  {%- endfor %}\n"
  "  {{- (loop_messages[0]['content'] | trim) + '<|eot_id|>' }}\n"
  "  {%- set loop_messages = loop_messages[1:] %}\n"
  "{%- endif %}\n"
  "{%- for message in loop_messages %}\n"
  "  {%- if message['role'] in ['tool', 'ipython'] %}\n"
  "    {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}\n"
  "    {%- if message['content'] is string %}\n"
  "      {{- message['content'] }}\n"
  "    {%- else %}\n"
  "      {{- message['content'] | tojson }}\n"
  "    {%- endif %}\n"
  "    {{- '<|eot_id|>' }}\n"
  "  {%- elif message['role'] == 'assistant' and message.get('tool_calls') %}\n"
  "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
  "    {%- if message['content'] %}\n"
  "      {{- (message['content'] | trim) + '\\n' }}\n"
  "    {%- endif %}\n"
  "    {%- for call in message['tool_calls'] %}\n"
  "      {%- if call['function'] is defined %}\n"
  "        {%- set call = call['function'] %}\n"
  "      {%- endif %}\n"
  "      {%- if not loop.first %}\n"
  "        {{- '\\n' }}\n"
  "      {%- endif %}\n"
  "      {{- '{\"name\": \"' + call['name'] + '\", \"parameters\": ' }}\n"
  "      {%- if call['arguments'] is string %}\n"
  "        {{- call['arguments'] }}\n"
  "      {%- else %}\n"
  "        {{- call['arguments'] | tojson }}\n"
  "      {%- endif %}\n"
  "      {{- '}' }}\n"
  "    {%- endfor %}\n"
  "    {{- '<|eot_id|>' }}\n"
  "  {%- elif message['role'] in ['user', 'assistant', 'system'] %}\n"
  "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
  " + (message['content'] | trim) + '<|eot_id|>' }}\n"
  "  {%- else %}\n"
  "    {{- raise_exception('Unknown message role: ' + message['role']) }}\n"
  "  {%- endif %}\n"
  "{%- endfor %}\n"
  "{%- if add_generation_prompt %}\n"
  "  {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
  "{%- endif %}\n"
)

# Special tokens each style needs as single tokens, and which of them plays which role.
QWEN25_SPECIAL_TOKENS = {
  "tokens": [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
  ],
  "bos_token": None,
  "eos_token": "<|im_end|>",
  "pad_token": "<|endoftext|>",
}
LLAMA3_SPECIAL_TOKENS = {
  "tokens": [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
    "<tool_call>",
    "</tool_call>",
  ],
  "bos_token": "<|begin_of_text|>",
  "eos_token": "<|eot_id|>",
  "pad_token": "<|finetune_right_pad_id|>",
}

# Qwen2.5's tool template with image parts: a message's content may be a list of text / image parts (the
# OpenAI form); an image part renders as Qwen2.5-VL's placeholder, which the image processor expands to the
# image's pad tokens (vision/processor.py). Text-only messages render exactly as QWEN25_CHAT_TEMPLATE.
QWEN25_VL_IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
_CONTENT_MACRO = (
  "{%- macro render_content(content) %}\n"
  "  {%- if content is string %}\n"
  "    {{- content }}\n"
  "  {%- else %}\n"
  "    {%- for part in content %}\n"
  "      {%- if part['type'] == 'image' or part['type'] == 'image_url' or 'image' in part or 'image_url' in part %}\n"
  "        {{- '" + QWEN25_VL_IMAGE_PLACEHOLDER + "' }}\n"
  "      {%- elif 'text' in part %}\n"
  "        {{- part['text'] }}\n"
  "      {%- endif %}\n"
  "    {%- endfor %}\n"
  "  {%- endif %}\n"
  "{%- endmacro %}\n"
)
QWEN25_VL_TOOLS_CHAT_TEMPLATE = _CONTENT_MACRO + QWEN25_CHAT_TEMPLATE.replace(
  "= messages[0]['content']", "= render_content(messages[0]['content'])"
).replace("+ message['content']", "+ render_content(message['content'])")
QWEN25_VL_SPECIAL_TOKENS = dict(
  QWEN25_SPECIAL_TOKENS,
  tokens=[*QWEN25_SPECIAL_TOKENS["tokens"], "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
)

CHAT_TEMPLATES = {
  "qwen2.5": (QWEN25_CHAT_TEMPLATE, QWEN25_SPECIAL_TOKENS),
  "qwen2.5-vl": (QWEN25_VL_TOOLS_CHAT_TEMPLATE, QWEN25_VL_SPECIAL_TOKENS),
  "llama3": (LLAMA3_CHAT_TEMPLATE, LLAMA3_SPECIAL_TOKENS),
}
