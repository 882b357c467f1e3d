// A Java transactional producer for the real-Kafka tier (tests/realkafka/test_transactions.py),
// compiled against the distribution's own kafka-clients jar.
//
// Usage: TransactionalProducer BOOTSTRAP TOPIC TRANSACTIONAL_ID TRANSACTIONS RECORDS_PER_TXN
// Prints "ready" after initTransactions, waits for a line on stdin (so several producers start
// their first transaction together), then runs TRANSACTIONS transactions of RECORDS_PER_TXN
// records "java-t<t>-r<r>", aborting those with t % 3 == 1 after flushing them (the records
// reach the log; the abort marker discards them). Prints "committed <t>" / "aborted <t>" per
// transaction and "done"; any error: "error <exception>" and exit status 1.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class TransactionalProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        String transactionalId = args[2];
        int transactions = Integer.parseInt(args[3]);
        int records = Integer.parseInt(args[4]);
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "java-transactional");
        props.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            System.out.println("ready");
            System.out.flush();
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
            for (int t = 0; t < transactions; t++) {
                producer.beginTransaction();
                for (int r = 0; r < records; r++) {
                    producer.send(new ProducerRecord<>(topic, "k", "java-t" + t + "-r" + r));
                }
                if (t % 3 == 1) {
                    producer.flush();
                    producer.abortTransaction();
                    System.out.println("aborted " + t);
                } else {
                    producer.commitTransaction();
                    System.out.println("committed " + t);
                }
                System.out.flush();
            }
            System.out.println("done");
        } catch (Exception e) {
            System.out.println("error " + e);
            System.exit(1);
        }
    }
}
