"""The OCI side: the prestart/poststop hook, the CDI spec's hooks and the runtime wrapper, reading
the state and bundle a runtime passes, and the hook's log line."""
