"""How ROCK's ModelService installs itself in a sandbox of quarry-test/python,
through the SDK's own variables (rock.env_vars), set here unless the caller
set them: the sandbox reaches no package index, and the image already has
python3 and rl-rock (with its `rock` command, scripts/images/python.sh), so
the "runtime" is links to them and the install checks that the model service
imports. Imported by tests/rock/model_driver.py and bench/rockbench before
they use the SDK."""
import os

INSTALL = {
    "ROCK_RTENV_PYTHON_V31114_INSTALL_CMD": (
        "mkdir -p runtime-env/bin && ln -sf /usr/bin/python3 runtime-env/bin/python"
        " && ln -sf /usr/bin/python3 runtime-env/bin/python3 && ln -sf /usr/local/bin/rock runtime-env/bin/rock"),
    "ROCK_MODEL_SERVICE_INSTALL_CMD": "python3 -c 'import rock.sdk.model.server.main'",
    "ROCK_PIP_INDEX_URL": "",
}

for k, v in INSTALL.items():
    os.environ.setdefault(k, v)
