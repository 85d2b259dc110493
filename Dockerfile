# boxtrail service image. Not built in this project's CI (no Docker engine there);
# it installs exactly what `make run` installs.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY boxtrail boxtrail
COPY ingest ingest
COPY query query
COPY symbolicate symbolicate
RUN pip install --no-cache-dir -c constraints.txt .
ENV BOXTRAIL_HOST=0.0.0.0 BOXTRAIL_DATA_DIR=/data
VOLUME /data
EXPOSE 8780
CMD ["boxtrail", "serve"]
