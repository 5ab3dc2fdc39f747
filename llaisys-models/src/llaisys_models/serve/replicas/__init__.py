"""Replicas of the server on Ray Serve (``llaisys serve --replicas N``; the ``ray`` extra).

    deployments.py  the Serve application: one ingress, N replicas (each a model, its engine and serve/app.py)
    forwarding.py   an HTTP request from the ingress to a replica's app, and its response back
    routing.py      what a request is routed by: its cache scope (tenant) and the text its prompt begins with
    prefix_index.py which replica was sent which prompt text, per cache scope (a radix tree each, bounded)
    router.py       the prefix-aware request router (Ray Serve's RequestRouter) over that index
    ray_metrics.py  each replica's engine metrics in Ray's metrics (its Prometheus export)
    launch.py       ``llaisys serve --replicas``: start or join a cluster, run the application

``llaisys_models.serve.ray_app:build_app`` builds the application for Ray's own ``serve run``.
routing.py and prefix_index.py need no Ray.
"""
