"""car-ray for agents built on a framework: one line binds the framework's model clients to
the run (`ctx`), and tools are recorded as steps. Each module imports its framework, which
is an optional extra (`pip install 'car-ray[agents]'`, `[langchain]`, `[pydantic-ai]`,
`[mcp]`); importing `car_ray` never does.

- `car_ray.integrations.openai_agents`: `run(ctx, agent, input)` runs an Agents SDK agent.
- `car_ray.integrations.langchain`: `chat_openai(ctx, ...)`, `chat_anthropic(ctx, ...)`.
- `car_ray.integrations.pydantic_ai`: `openai_model(ctx, name)`, `anthropic_model(...)`.
- `car_ray.integrations.mcp`: `recorded(session)` records an MCP client session's calls.

A tool a framework calls from inside is recorded where it is defined: `@car_ray.tool`
(`@car_ray.tool(effect=True)` for a side effect)."""
