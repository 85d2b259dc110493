"""What the tests share: real servers started in temp dirs (``server``, ``cluster``,
``pgserver``, ``redisserver``, ``s3server``), a fault-injecting proxy (``faultproxy``) and
the scenarios run through it (``partial``), SSE reading (``sse``), hostile input
(``hostile``), crash ledgers (``crashload``) and the function-name matrix (``names_matrix``)."""
