// In-memory MongoDB wire-protocol server for the tests (mongo-java-server).
//
//   java -cp '.deps/mongo-java-server/*' tests/mongo/MongoTestServer.java PORT
//
// Binds 127.0.0.1:PORT (0 picks a free port), prints "LISTENING <port>" on
// stdout once the socket accepts connections, and runs until stdin reaches
// end of file or the process gets SIGTERM/SIGINT. Everything it holds is lost
// when it exits, like a wiped database.

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;

public class MongoTestServer {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: MongoTestServer PORT");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        // Before the first logger exists: only warnings, on stderr.
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        MongoServer server = new MongoServer(new MemoryBackend());
        server.bind(new InetSocketAddress("127.0.0.1", port));
        // SIGTERM/SIGINT run shutdown hooks; close the listening socket and
        // the client connections so a restart can bind the same port.
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdownNow));

        InetSocketAddress bound = server.getLocalAddress();
        System.out.println("LISTENING " + bound.getPort());
        System.out.flush();

        // The parent holds our stdin: when it closes (or the parent dies),
        // stop serving.
        InputStream in = System.in;
        byte[] buf = new byte[256];
        try {
            while (in.read(buf) >= 0) {
                // ignore input
            }
        } catch (IOException e) {
            // treat a broken stdin like end of file
        }
        System.exit(0);
    }
}
