# boxtrail service image: one node (`boxtrail serve`), data in /data.
#
# UNTESTED HERE: no Docker engine runs where this was written, so this image has never
# been built or started. It installs what `make run` installs (`pip install -c
# constraints.txt .`, without the dev extra), as a regular (non-editable) install.
FROM python:3.11-slim

# The packages listed in pyproject.toml; console's static files go in as package data.
COPY pyproject.toml constraints.txt /src/
COPY boxtrail /src/boxtrail
COPY cluster /src/cluster
COPY console /src/console
COPY core /src/core
COPY ingest /src/ingest
COPY metadata /src/metadata
COPY query /src/query
COPY symbolicate /src/symbolicate
COPY tenancy /src/tenancy
RUN pip install --no-cache-dir -c /src/constraints.txt /src && rm -rf /src

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
