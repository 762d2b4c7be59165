import { performance } from 'node:perf_hooks';
import { ZooKeeperError } from './zookeeper.client.js';
import { createNodes, findNodes, removeNodes, type Created, type LinePaths, type LineRequest } from './zookeeper.line.js';
import type { ParentNodes } from './zookeeper.parents.js';
import type { LineRequests } from './zookeeper.requests.js';
import type { LiveSession } from './zookeeper.session.js';

/**
 * How a request gets its place in the lines of its keys: one create at a time, settled before
 * anything looks for its nodes or makes others, and the nodes of a create whose answer was lost
 * found by the owner's name.
 */
export class LinePlaces {
  constructor(
    private readonly requests: LineRequests,
    private readonly paths: LinePaths,
    private readonly parents: ParentNodes,
  ) {}

  /**
   * Waits for the request's create in flight, then, if a create's answer was lost, looks for its
   * nodes. False when the request was given up meanwhile: it must not make nodes again.
   */
  async settle(session: LiveSession, request: LineRequest): Promise<boolean> {
    // Attempts that timed out go on: woken together when a create fails, each would otherwise make
    // nodes of its own, and those whose answers were lost too would stand in line for nobody (the
    // request itself waiting behind one of them). So this is looked at again after every wait.
    for (;;) {
      const inFlight = request.creating;
      if (inFlight?.generation === session.generation) {
        await inFlight.settled;
        continue;
      }
      // Given up (released, or a caller that would not wait): what is left of this attempt, which
      // its caller stopped waiting for, must not make nodes again.
      if (!this.requests.isCurrent(request)) return false;
      if (request.nodes && request.generation !== session.generation) request.nodes = undefined;
      if (request.nodes || !request.uncertain) return true;
      // Nodes it gave up and could not delete yet (it lost its place and started over) are not its
      // place: earlier in their lines than its new ones, with the old czxid, below the token of a
      // caller that passed it meanwhile.
      const leftover = this.requests.leftoverNodes(request.owner);
      const found = (await findNodes(session.client, this.paths, request)).map((nodes) => nodes.filter((node) => !leftover.has(node)));
      // Another attempt sent a create, or found them, meanwhile.
      if (request.creating?.generation === session.generation || !request.uncertain) continue;
      request.uncertain = false;
      // Made in an earlier session (see LineRequest.createdIn), they go: they would stand in line
      // for nobody until the server ends that session.
      const ours = request.createdIn === session.generation && found.every((nodes) => nodes.length > 0);
      // The earliest of each line is its place (one create made one node in every line); any
      // later ones stand behind it for nobody.
      if (ours)
        this.adopt(
          request,
          session,
          found.map((nodes) => nodes[0]),
        );
      const others = ours ? found.flatMap((nodes) => nodes.slice(1)) : found.flat();
      if (others.length > 0) await removeNodes(session.client, others);
    }
  }

  /**
   * Makes the request's nodes: the lines read right behind the create when they are its place, none
   * when they were found by name meanwhile; false when its caller gave up meanwhile (the nodes went
   * again).
   */
  async create(session: LiveSession, request: LineRequest): Promise<{ lines?: Created['lines'] } | false> {
    request.createdIn = session.generation;
    const sentAt = performance.now();
    const creating = createNodes(session, this.paths, request, this.parents.known);
    // Runs before the await below resumes: an answer that comes after the caller gave up on it
    // still tells where the nodes are.
    const inFlight = {
      generation: session.generation,
      settled: creating
        .then(
          (made) => this.created(request, session, made, sentAt),
          (error: unknown) => this.createFailed(request, error),
        )
        .finally(() => {
          if (request.creating === inFlight) request.creating = undefined;
        }),
    };
    request.creating = inFlight;
    const made = await creating;
    if (request.nodes === undefined) return false;
    return request.nodes === made.nodes ? { lines: made.lines } : {};
  }

  /** A create answered: its nodes are the request's place, or go when the request has one, or was given up. */
  private created(request: LineRequest, session: LiveSession, { nodes, czxid }: Created, sentAt: number): void {
    if (this.requests.isCurrent(request) && !request.nodes) {
      this.adopt(request, session, nodes, czxid);
      request.certifiedAt = sentAt;
      request.uncertain = false;
    } else if (request.nodes?.join('\n') !== nodes.join('\n')) {
      // Not the ones already found by name after a lost answer: they would stand in line for
      // nobody, for as long as the session lives.
      const leftover = { ...request, nodes, uncertain: false };
      removeNodes(session.client, nodes).catch(() => this.requests.removeLater(leftover, false));
    }
  }

  /**
   * A create that failed without an answer (a dropped connection) may have been applied: the
   * request's next attempt looks for its nodes by name; a request given up meanwhile has no next
   * attempt, so they are looked for and deleted as soon as ZooKeeper answers.
   */
  private createFailed(request: LineRequest, error: unknown): void {
    if (request.nodes || !outcomeUnknown(error)) return;
    request.uncertain = true;
    if (!this.requests.isCurrent(request)) this.requests.removeLater(request);
  }

  /** `czxid`: known from the create's answer; else (nodes found by name) read by the next look. */
  private adopt(request: LineRequest, session: LiveSession, nodes: string[], czxid?: number): void {
    request.nodes = nodes;
    request.generation = session.generation;
    request.czxid = czxid;
    request.watched.clear();
    request.ownWatch = undefined;
    request.certifiedAt = undefined;
  }
}

/** Whether a failed request may still have been applied: it was sent, and no answer came. */
function outcomeUnknown(error: unknown): boolean {
  return !(error instanceof ZooKeeperError) || error.code === 'CONNECTION_LOSS' || error.code === 'OPERATION_TIMEOUT';
}
