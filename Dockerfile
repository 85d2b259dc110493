# boxtrail service image: one node (`boxtrail serve`), data in /data.
#
# Built and checked by tests/deploy/test_image.py on every `make test` (how, and what it
# cannot check here: the README's Docker section). `make image` builds it.

# --- build: a virtualenv holding boxtrail and what it runs on, nothing else -----------
FROM python:3.11-slim AS build
# setup.py compiles ingest/_core.c: gcc and the libc headers, in this stage only (the base
# has Python.h). The runtime stage takes the built module, not the compiler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/boxtrail
WORKDIR /src
# The dependencies first, in a layer of their own: a change to the code alone does not
# install them again. The pins come from constraints.txt, as for `make run`.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && /opt/boxtrail/bin/pip install --no-cache-dir -c constraints.txt -r requirements.txt
# Then the project itself, from the whole tree the .dockerignore lets in: the packages are
# the ones pyproject.toml finds, so a new one is never left out. No dev extra.
COPY . .
RUN /opt/boxtrail/bin/pip install --no-cache-dir --no-deps . \
    && /opt/boxtrail/bin/pip check

# --- runtime: the base image, the virtualenv, a user; no compiler, no sources, no tests -
FROM python:3.11-slim
COPY --from=build /opt/boxtrail /opt/boxtrail
ENV PATH=/opt/boxtrail/bin:$PATH

# Fixed numeric ids, so runAsNonRoot-style checks can verify them. /data is made and
# owned here: a new named volume mounted on it takes this owner (a bind mount must be
# owned by 10001 beforehand).
RUN groupadd --system --gid 10001 boxtrail \
    && useradd --system --uid 10001 --gid boxtrail --no-create-home boxtrail \
    && mkdir /data && chown boxtrail:boxtrail /data
ENV BOXTRAIL_HOST=0.0.0.0 BOXTRAIL_PORT=8780 BOXTRAIL_DATA_DIR=/data
VOLUME /data
# The working directory must be writable: DuckDB spills large queries to ./.tmp.
WORKDIR /data
USER 10001:10001
EXPOSE 8780

# Liveness only (/readyz also needs the storage); the slim image has no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('BOXTRAIL_PORT', '8780') + '/healthz', timeout=4)"]

CMD ["boxtrail", "serve"]
