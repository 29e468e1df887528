import httpx
import pytest

from tests.e2e.otlp_receiver import OTLPReceiver
from tests.e2e.server_proc import ServerProc

API_KEY = "test-key-123"
# the arguments of the weather tool the API tests offer (OpenAI chat, Responses, Messages)
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}


@pytest.fixture(scope="session")
def boot_log(tmp_path_factory):
    return tmp_path_factory.mktemp("serve") / "boot.jsonl"


@pytest.fixture(scope="session")
def served(boot_log):
    """One default-model server shared by the e2e tests that do not stop it."""
    srv = ServerProc(
        boot_log,
        "--kv-tokens",
        "4096",
        "--max-running",
        "8",
        "--served-model-name",
        "smol",
        "--api-key",
        API_KEY,
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def server(served):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=served.base, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def receiver():
    """An OTLP/HTTP receiver on loopback, one per test module that asks for it."""
    rec = OTLPReceiver()
    yield rec
    rec.close()
