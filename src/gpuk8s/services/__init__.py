"""Long-running services: device plugin, labeller, scheduler extender."""
