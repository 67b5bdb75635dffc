"""Google Cloud Vertex AI's prediction protocol, as llama-server b11434 serves it with
AIP_MODE=PREDICTION (tools/server/server-http.cpp `register_gcp_compat`): the port from
AIP_HTTP_PORT, AIP_HEALTH_ROUTE answered as /health, and POST AIP_PREDICT_ROUTE taking
`{"instances": [...]}`, each instance a request body for the route its `@requestFormat` names
(a path or its camelCase alias), answered as `{"predictions": [...]}` in order."""

import subprocess

import requests

from conftest import BIN, PLUGINS, QWEN3_TEMPLATE, Server, free_port


def gcp_server(tiny_path, *flags, **env):
    port = free_port()
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), **env}
    return Server(tiny_path, "-np", "2", "--chat-template-file", str(QWEN3_TEMPLATE), *flags,
                  env=env, port=port)


def test_instances_are_answered_by_the_routes_they_name(tiny_path):
    s = gcp_server(tiny_path, AIP_PREDICT_ROUTE="v1/endpoints/7:predict", AIP_HEALTH_ROUTE="/ready")
    try:
        assert s.get("/ready").json() == {"status": "ok"}
        chat = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
        instances = [
            {"@requestFormat": "chatCompletions", **chat},
            {"@requestFormat": "/completion", "prompt": "x", "n_predict": 3, "temperature": 0},
            # A streamed request is answered whole.
            {"@requestFormat": "completion", "prompt": "x", "n_predict": 3, "temperature": 0, "stream": True},
            {"@requestFormat": "tokenize", "content": "hello"},
            {"@requestFormat": "nowhere"},
            {"prompt": "x"},
            "text",
            # The route's own error is the instance's prediction.
            {"@requestFormat": "completion", "prompt": "x", "n_predict": "three"},
        ]
        r = s.post("/v1/endpoints/7:predict", {"instances": instances})
        assert r.status_code == 200, r.text
        p = r.json()["predictions"]
        assert len(p) == len(instances)
        assert p[0]["object"] == "chat.completion" and p[0]["choices"][0]["message"]["role"] == "assistant"
        assert p[0]["choices"][0]["message"]["content"] == s.post("/v1/chat/completions", chat).json()[
            "choices"][0]["message"]["content"]
        assert p[1]["tokens_predicted"] == 3 and p[2]["content"] == p[1]["content"]
        assert p[3]["tokens"] == s.post("/tokenize", {"content": "hello"}).json()["tokens"]
        assert p[4]["error"]["message"] == "no handler registered for @requestFormat: nowhere"
        assert p[5]["error"]["message"] == "each instance must include a string @requestFormat"
        assert p[6]["error"]["message"] == "each instance must be a JSON object"
        assert p[7]["error"]["code"] == 400
        # The body's own faults are the request's.
        for body, msg in [({"instances": {}}, "request body must include an array field named instances"),
                          ([], "request body must be a JSON object"),
                          ({"instances": [{}] * 129}, "instances array exceeds maximum size of 128")]:
            r = s.post("/v1/endpoints/7:predict", body)
            assert r.status_code == 400 and r.json()["error"]["message"] == msg, r.text
    finally:
        s.stop()


def test_the_api_key_guards_the_predict_route(tiny_path):
    s = gcp_server(tiny_path, "--api-key", "k")
    try:
        body = {"instances": [{"@requestFormat": "tokenize", "content": "a"}]}
        assert requests.post(s.url + "/predict", json=body).status_code == 401
        r = requests.post(s.url + "/predict", json=body, headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and r.json()["predictions"][0]["tokens"], r.text
    finally:
        s.stop()


def test_a_predict_route_on_a_route_of_the_server_is_refused_by_name(tiny_path):
    env = {"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "/completion", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([BIN, "--plugin-dir", PLUGINS, "serve", "-m", str(tiny_path)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "AIP_PREDICT_ROUTE=/completion conflicts" in r.stderr, r.stderr
