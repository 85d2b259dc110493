"""The web console: static assets (``static/``) served by boxtrail at ``/`` (``routes``)."""
