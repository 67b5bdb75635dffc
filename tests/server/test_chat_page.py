"""The chat page in headless Chromium (Debian's `chromium` and `chromium-driver`, driven by the
pinned selenium; `cargo xtask test` installs both, nothing is downloaded at run time) against the
real server with the gemma-3-270m demo model: the page loads and shows the model, a message
streams with its timings, stop cuts an answer, regenerate replaces one, a refused request is shown
as an error, reasoning is shown folded and tool calls shown, conversations survive a reload, the
server panel shows /props, /slots and the expert counters, and a page from another origin reaches
the API through CORS.

Set BLOOMERY_PAGE_SCREENSHOT=path to keep the screenshot it takes (docs/chat-page.png was made so).
"""
import json
import os
import shutil
import time

import pytest

from conftest import Server

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

if not (CHROMIUM and CHROMEDRIVER):
    MESSAGE = ("\n" + "!" * 78 + "\n!! the chat page's browser tests are SKIPPED: Debian's chromium and "
               "chromium-driver\n!! are not installed (cargo xtask test installs them with apt-get)\n" + "!" * 78)
    print(MESSAGE)
    pytest.skip(MESSAGE, allow_module_level=True)

from selenium import webdriver  # noqa: E402  (only where a browser exists)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ALIAS = "gemma3-270m"


@pytest.fixture(scope="module")
def server(gemma3_path):
    s = Server(gemma3_path, "-c", "2048", "-np", "2", "--metrics", "-a", ALIAS, "-s", "42")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1360,860",
              f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"]:
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    yield d
    d.quit()


def wait(driver, what, timeout=180):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: what(d))


def css(driver, selector):
    return driver.find_elements(By.CSS_SELECTOR, selector)


def text_of(driver, selector):
    """The rendered text of the last element `selector` matches, read in one script call (a
    streaming message is redrawn on every piece, so an element found first may be gone by the
    time a second call reads it)."""
    return driver.execute_script(
        "const found = document.querySelectorAll(arguments[0]);"
        "return found.length ? found[found.length - 1].innerText : '';", selector)


def set_field(driver, field, value):
    """Types into a settings field (the page saves it on input)."""
    box = driver.find_element(By.ID, "set-" + field)
    box.clear()
    if value:
        box.send_keys(value)


def send(driver, text):
    box = driver.find_element(By.ID, "prompt")
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def idle(driver):
    """Waits for no answer to be streaming."""
    wait(driver, lambda d: d.find_element(By.ID, "send").is_displayed())


def open_page(driver, url):
    driver.get(url)
    wait(driver, lambda d: d.find_element(By.ID, "model").text == ALIAS)


def test_load_send_and_stream(server, browser):
    open_page(browser, server.url)
    browser.execute_script("localStorage.clear(); location.reload();")
    wait(browser, lambda d: d.find_element(By.ID, "model").text == ALIAS)
    browser.find_element(By.ID, "toggle-settings").click()
    set_field(browser, "max_tokens", "24")
    set_field(browser, "temperature", "0")
    set_field(browser, "system", "You are a helpful assistant.")
    browser.find_element(By.ID, "toggle-settings").click()
    # Every state of the streaming answer's text, as the page drew it.
    browser.execute_script("""
        window.seen = [];
        new MutationObserver(() => {
          const c = document.querySelector('.msg.streaming .content');
          if (c) window.seen.push(c.textContent.length);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true});
    """)
    send(browser, "What is the capital of France?")
    wait(browser, lambda d: css(d, ".msg.streaming"))
    assert browser.find_element(By.ID, "stop").is_displayed()
    wait(browser, lambda d: css(d, ".msg.assistant .timings"))
    seen = browser.execute_script("return window.seen")
    grew = sorted(set(seen))
    assert len(grew) >= 3, f"the answer did not stream: lengths seen {seen}"
    answer = text_of(browser, ".msg.assistant .content")
    assert answer and len(answer) >= grew[-1] - 1
    timings = text_of(browser, ".msg.assistant .timings")
    assert "prompt" in timings and "tok/s" in timings and "cached" in timings and "decode 24 tok" in timings
    roles = browser.execute_script("return [...document.querySelectorAll('.msg .role')].map(e => e.innerText)")
    assert roles == ["user", "assistant"]


def test_conversations_survive_a_reload(server, browser):
    before = text_of(browser, ".msg.assistant .content")
    browser.refresh()
    wait(browser, lambda d: d.find_element(By.ID, "model").text == ALIAS)
    assert text_of(browser, ".msg.assistant .content") == before
    assert text_of(browser, "#chat-list li.current span") == "What is the capital of France?"
    assert browser.find_element(By.ID, "set-max_tokens").get_attribute("value") == "24"


def test_regenerate_replaces_the_last_answer(server, browser):
    browser.find_element(By.ID, "toggle-settings").click()
    set_field(browser, "max_tokens", "6")
    browser.find_element(By.ID, "toggle-settings").click()
    first = text_of(browser, ".msg.assistant .content")
    browser.find_element(By.CSS_SELECTOR, ".msg.assistant .regenerate").click()
    wait(browser, lambda d: css(d, ".msg.streaming"))
    idle(browser)
    wait(browser, lambda d: "decode 6 tok" in text_of(d, ".msg.assistant .timings"))
    assert len(css(browser, ".msg.assistant")) == 1
    # Greedy: the same six tokens begin the earlier answer.
    assert first.startswith(text_of(browser, ".msg.assistant .content").strip()[:6])


def test_stop_cuts_an_answer_and_frees_the_slot(server, browser):
    browser.find_element(By.ID, "toggle-settings").click()
    set_field(browser, "max_tokens", "1500")
    browser.find_element(By.ID, "toggle-settings").click()
    send(browser, "Write a very long story about a lighthouse keeper.")
    wait(browser, lambda d: len(text_of(d, ".msg.streaming .content")) > 5)
    browser.find_element(By.ID, "stop").click()
    wait(browser, lambda d: css(d, ".msg.assistant .stopped"), timeout=30)
    idle(browser)
    assert "decode" not in text_of(browser, ".msg.assistant:last-child .meta")
    deadline = time.time() + 30
    while any(s["is_processing"] for s in server.get("/slots").json()):
        assert time.time() < deadline, "the stopped request still holds its slot"
        time.sleep(0.1)


def test_a_refused_request_is_shown_as_an_error(server, browser):
    browser.find_element(By.ID, "toggle-settings").click()
    set_field(browser, "max_tokens", "-5")
    browser.find_element(By.ID, "toggle-settings").click()
    send(browser, "Hello?")
    wait(browser, lambda d: css(d, ".msg.error"), timeout=60)
    shown = text_of(browser, ".msg.error .error-text")
    assert shown.startswith("400: ") and "max_tokens" in shown, shown
    idle(browser)
    # The page and the server both go on.
    browser.find_element(By.ID, "toggle-settings").click()
    set_field(browser, "max_tokens", "4")
    browser.find_element(By.ID, "toggle-settings").click()
    browser.find_element(By.CSS_SELECTOR, ".msg.error .regenerate").click()
    wait(browser, lambda d: "decode 4 tok" in text_of(d, ".msg.assistant .timings"), timeout=120)


def test_reasoning_is_folded_and_tool_calls_shown(server, browser):
    chat = {"id": "stored", "title": "stored chat", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "reasoning": "The user wants the weather.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}],
         "timings": {"prompt_n": 12, "prompt_per_second": 100.0, "cache_n": 3, "predicted_n": 9,
                     "predicted_per_second": 20.0}},
    ]}
    browser.execute_script("localStorage.setItem('bloomery.chats', JSON.stringify([arguments[0]]));"
                           "localStorage.setItem('bloomery.current', 'stored'); location.reload();", chat)
    wait(browser, lambda d: d.find_element(By.ID, "model").text == ALIAS)
    folded = browser.find_element(By.CSS_SELECTOR, ".msg.assistant details.reasoning")
    assert folded.get_attribute("open") is None
    assert not browser.find_element(By.CSS_SELECTOR, "details.reasoning div").is_displayed()
    browser.find_element(By.CSS_SELECTOR, "details.reasoning summary").click()
    assert browser.find_element(By.CSS_SELECTOR, "details.reasoning div").text == "The user wants the weather."
    call = text_of(browser, ".tool-call")
    assert call.startswith("tool call: get_weather") and json.loads(call.split("\n", 1)[1]) == {"city": "Paris"}
    assert "cached 3" in text_of(browser, ".timings")


def test_the_server_panel_shows_props_slots_and_experts(server, browser):
    browser.find_element(By.ID, "toggle-server").click()
    wait(browser, lambda d: ALIAS in d.find_element(By.ID, "props").text, timeout=30)
    assert "1024" in browser.find_element(By.ID, "props").text  # context per slot: 2048 over 2
    wait(browser, lambda d: len(css(d, "#slots tbody tr")) == 2, timeout=30)
    states = browser.execute_script(
        "return [...document.querySelectorAll('#slots tbody tr')].map(r => r.cells[1].innerText)")
    assert len(states) == 2 and set(states) <= {"idle", "busy"}, states
    wait(browser, lambda d: "served on the card" in d.find_element(By.ID, "experts").text, timeout=30)
    browser.find_element(By.ID, "toggle-server").click()


def test_a_page_of_another_origin_reaches_the_api(server, browser):
    # localhost and 127.0.0.1 are different origins: the fetch below is cross-origin, and its
    # Authorization header makes the browser send a preflight first.
    browser.get(f"http://localhost:{server.port}/chat.css")
    got = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch(arguments[0] + '/props', {headers: {'Authorization': 'Bearer anything'}})
          .then(r => r.json()).then(j => done(j.model_alias), e => done('failed: ' + e));
    """, server.url)
    assert got == ALIAS


def test_the_page_works_under_an_api_prefix(gemma3_path, browser):
    """With `--api-prefix /chat` the page is at /chat/ and reaches the API under the prefix."""
    s = Server(gemma3_path, "-c", "1024", "-np", "1", "-a", ALIAS, "--api-prefix", "/chat", prefix="/chat")
    try:
        open_page(browser, s.url)  # /chat redirects to /chat/
        assert browser.current_url == s.url + "/"
        browser.execute_script("localStorage.clear(); location.reload();")
        wait(browser, lambda d: d.find_element(By.ID, "model").text == ALIAS)
        browser.find_element(By.ID, "toggle-settings").click()
        set_field(browser, "max_tokens", "4")
        browser.find_element(By.ID, "toggle-settings").click()
        send(browser, "Hello")
        wait(browser, lambda d: css(d, ".msg.assistant .timings"))
        assert "decode 4 tok" in text_of(browser, ".msg.assistant .timings")
    finally:
        s.stop()


def test_the_servers_ui_config_fills_the_settings_the_browser_has_not_set(gemma3_path, browser):
    """`--ui-config` (llama-server's `ui_settings` in /props) gives the page's defaults, under
    the page's own setting names; what this browser stored wins, and a default is not stored."""
    config = json.dumps({"system": "Be brief.", "temperature": 0.3, "unknown_setting": 1})
    s = Server(gemma3_path, "-c", "1024", "-np", "1", "-a", ALIAS, "--ui-config", config)
    try:
        open_page(browser, s.url)
        browser.execute_script("localStorage.clear(); "
                               "localStorage.setItem('bloomery.settings', JSON.stringify({temperature: '0.9'}));"
                               "location.reload();")
        wait(browser, lambda d: d.find_element(By.ID, "model").text == ALIAS)
        wait(browser, lambda d: d.find_element(By.ID, "set-system").get_property("value") == "Be brief.")
        assert browser.find_element(By.ID, "set-temperature").get_property("value") == "0.9"
        browser.find_element(By.ID, "toggle-settings").click()
        set_field(browser, "top_k", "7")
        browser.find_element(By.ID, "toggle-settings").click()
        stored = json.loads(browser.execute_script("return localStorage.getItem('bloomery.settings')"))
        assert stored.get("top_k") == "7" and stored.get("temperature") == "0.9" and "system" not in stored
    finally:
        s.stop()


def test_screenshot(server, browser, tmp_path):
    open_page(browser, server.url)
    browser.execute_script("localStorage.clear(); location.reload();")
    wait(browser, lambda d: d.find_element(By.ID, "model").text == ALIAS)
    browser.find_element(By.ID, "toggle-settings").click()
    set_field(browser, "max_tokens", "48")
    set_field(browser, "temperature", "0")
    browser.find_element(By.ID, "toggle-settings").click()
    send(browser, "Name three rivers in Europe.")
    wait(browser, lambda d: css(d, ".msg.assistant .timings"))
    browser.find_element(By.ID, "toggle-server").click()
    wait(browser, lambda d: "served on the card" in d.find_element(By.ID, "experts").text, timeout=30)
    out = os.environ.get("BLOOMERY_PAGE_SCREENSHOT") or str(tmp_path / "chat-page.png")
    assert browser.save_screenshot(out)
    assert os.path.getsize(out) > 10_000
