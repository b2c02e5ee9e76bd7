"""The official OpenAI and Anthropic Python SDKs against a running `deepinfer serve`.

Usage: python clients.py BASE_URL   (e.g. http://127.0.0.1:8000)
Run by tests/server_sdk.rs; prints one line per check and exits non-zero on the first failure.
"""

import json
import sys

import anthropic
import openai

base = sys.argv[1].rstrip("/")
oa = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
MSG = [{"role": "user", "content": "Hello, who are you?"}]
# The checks that count tokens ask for all of them (vLLM's `ignore_eos`): the embedded model
# is trained, so it may end an answer before the limit.
LONG = {"ignore_eos": True}


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print(f"ok   {name}")


# Chat, not streamed.
r = oa.chat.completions.create(model="deepinfer", messages=MSG, max_tokens=6, seed=11, temperature=0.7, extra_body=LONG)
check("chat", r.choices[0].message.content is not None and r.usage.completion_tokens == 6, r)

# Chat, streamed with usage: the same text for the same seed.
text, usage = "", None
for chunk in oa.chat.completions.create(
    model="deepinfer", messages=MSG, max_tokens=6, seed=11, temperature=0.7,
    stream=True, stream_options={"include_usage": True}, extra_body=LONG,
):
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    if chunk.usage:
        usage = chunk.usage
check("chat stream", text == r.choices[0].message.content, (text, r.choices[0].message.content))
check("chat stream usage", usage is not None and usage.completion_tokens == 6, usage)

# n and logprobs.
r = oa.chat.completions.create(model="deepinfer", messages=MSG, max_tokens=3, n=2, logprobs=True, top_logprobs=2, extra_body=LONG)
check("n=2 logprobs", len(r.choices) == 2 and len(r.choices[1].logprobs.content) == 3, r)

# A JSON-schema answer.
schema = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
r = oa.chat.completions.create(
    model="deepinfer", messages=MSG, max_tokens=80, seed=3,
    response_format={"type": "json_schema", "json_schema": {"name": "trip", "strict": True, "schema": schema}},
)
c = r.choices[0]
if c.finish_reason == "stop":
    v = json.loads(c.message.content)
    check("json_schema", isinstance(v["city"], str) and isinstance(v["days"], int), v)
else:
    check("json_schema (cut at the limit)", c.finish_reason == "length", c)

# A strict tool call.
tools = [{
    "type": "function",
    "function": {
        "name": "get_weather", "strict": True,
        "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"], "additionalProperties": False,
        },
    },
}]
r = oa.chat.completions.create(model="deepinfer", messages=MSG, tools=tools, tool_choice="required", max_tokens=120, seed=5)
c = r.choices[0]
if c.finish_reason == "tool_calls":
    call = c.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    check("strict tool call", call.function.name == "get_weather" and isinstance(args["city"], str), c)
else:
    check("strict tool call (cut at the limit)", c.finish_reason == "length", c)

# Responses, streamed and not.
r = oa.responses.create(model="deepinfer", input="Hello", max_output_tokens=5, extra_body=LONG)
check("responses", r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and isinstance(r.output_text, str), r)
kinds = [e.type for e in oa.responses.create(model="deepinfer", input="Hello", max_output_tokens=5, stream=True, extra_body=LONG)]
check("responses stream", kinds[0] == "response.created" and kinds[-1] == "response.incomplete", kinds)

# Legacy completions and models.
r = oa.completions.create(model="deepinfer", prompt="Once upon a time", max_tokens=4, extra_body=LONG)
check("completions", r.usage.completion_tokens == 4 and isinstance(r.choices[0].text, str), r)
check("models", [m.id for m in oa.models.list()] == ["deepinfer"])

# Errors come back as the SDKs' typed errors.
try:
    oa.chat.completions.create(model="deepinfer", messages=MSG, temperature=-1)
    check("openai 400", False, "no error")
except openai.BadRequestError as e:
    check("openai 400", e.status_code == 400)

# Anthropic Messages, streamed and not.
m = an.messages.create(model="deepinfer", max_tokens=5, messages=MSG, extra_body=LONG)
check("messages", m.content[0].type == "text" and m.stop_reason == "max_tokens", m)
with an.messages.stream(model="deepinfer", max_tokens=5, messages=MSG, extra_body=LONG) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("messages stream", streamed == final.content[0].text and final.usage.output_tokens == 5, final)
try:
    an.messages.create(model="deepinfer", max_tokens=5, messages=[])
    check("anthropic 400", False, "no error")
except anthropic.BadRequestError as e:
    check("anthropic 400", e.status_code == 400)

print("sdk: all checks passed")
