# KiCI Scaler Console. Quick start: `make run`, then `make test`.
.PHONY: run stop-agents test lint check bench clean

run:  ## set up everything missing, then run the console, its rq worker and the sweeper
	bash scripts/run.sh

stop-agents:  ## end the agents make run left running (a console restart keeps them), and their network
	bash scripts/stop_agents.sh

test:  ## the whole suite (real PostgreSQL, Redis, dockerd, nft, Chromium)
	bash scripts/test.sh $(ARGS)

lint:  ## ruff (lint, import order, formatting; FIX=1 rewrites the files) and mypy
	bash scripts/lint.sh $(if $(FIX),--fix,)

check:  ## validate the scaler config without applying it (CONFIG=path to check another file)
	bash scripts/check.sh $(CONFIG)

bench:  ## print the benchmark figures
	for b in bench/*.py; do echo "== $$b"; .venv/bin/python $$b || exit 1; done

clean:  ## remove the venv and var/ (generated secrets included), stopping the console's Redis first
	@if [ -S var/run/redis/redis.sock ] && [ -f var/env ]; then bash -c '. scripts/lib.sh && . var/env && stop_console_redis'; fi
	rm -rf .venv var .pytest_cache
