"""The web console: static assets served by boxtrail at ``/`` (``console.routes``)."""
